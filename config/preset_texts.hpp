// The preset config.json texts embedded in the binary (config/preset_texts.cpp is generated
// from config/presets/*.json by config/presets/embed.sh). Read through config/model_config.hpp.
#pragma once

namespace cedar {

struct preset_text {
  const char* name;  ///< file name without .json
  const char* json;  ///< the file's bytes
};

extern const preset_text preset_texts[];
extern const int num_preset_texts;

}  // namespace cedar
