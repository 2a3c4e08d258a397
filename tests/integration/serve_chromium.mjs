// Headless Chromium on the chat page (see serve_chromium.sh).
import assert from "node:assert/strict";
import { createRequire } from "node:module";
const require = createRequire(process.env.CEDAR_ROOT + "/tools/node/package.json");
const { chromium } = require("playwright-core");

const context = await chromium.launchPersistentContext(process.env.PROFILE, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = context.pages()[0] || (await context.newPage());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(process.env.URL + "/");
  await page.waitForFunction(() => document.getElementById("conn").textContent === "connected", null, { timeout: 10000 });
  console.log("  ok  the page loads and opens its WebSocket");

  await page.check("#thinking");
  await page.fill("#input", "What is the weather in Paris?");
  await page.click("#send");
  // Sample the answer while it streams: it must grow in several steps, not arrive at once.
  const lengths = new Set();
  const deadline = Date.now() + 20000;
  let done = false;
  while (!done && Date.now() < deadline) {
    const s = await page.evaluate(() => {
      const a = [...document.querySelectorAll(".turn.assistant")].pop();
      if (!a) return null;
      return { text: a.querySelector(".text").textContent, meta: a.querySelector(".meta").textContent };
    });
    if (s) { lengths.add(s.text.length); done = s.meta.length > 0; }
    await page.waitForTimeout(25);
  }
  assert.ok(done, "the response did not finish");
  const partial = [...lengths].filter((n) => n > 0 && n < 60);
  assert.ok(partial.length >= 3, `text did not stream (lengths seen: ${[...lengths].join(",")})`);
  console.log(`  ok  the answer streamed in (${lengths.size} distinct lengths seen)`);

  const turn = await page.evaluate(() => {
    const a = [...document.querySelectorAll(".turn.assistant")].pop();
    return { reasoning: a.querySelector(".reasoning").textContent, text: a.querySelector(".text").textContent,
             tools: a.querySelector(".tools").textContent, meta: a.querySelector(".meta").textContent };
  });
  assert.equal(turn.reasoning, "Let me check the weather.");
  assert.equal(turn.text, "Here is what I found for Paris today, one word at a time.");
  assert.ok(turn.tools.includes("get_weather") && turn.tools.includes("Paris"), turn.tools);
  assert.match(turn.meta, /^completed - \d+ in/);
  console.log("  ok  reasoning, text and the tool call are shown apart");

  await page.waitForFunction(() => /tokens out/.test(document.getElementById("metrics").textContent) &&
    [...document.querySelectorAll("#metrics tr")].some((r) => r.textContent.startsWith("tokens out") && !/\b0$/.test(r.textContent)),
    null, { timeout: 10000 });
  console.log("  ok  live metrics show the tokens streamed");
  assert.deepEqual(errors, []);
  console.log("serve_chromium: 4 checks passed");
} finally {
  await context.close();
}
