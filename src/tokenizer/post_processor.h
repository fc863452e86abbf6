// tokenizer.json "post_processor" for single sequences: the special-token ids placed before and
// after the encoded text (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel,
// Sequence).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_util.h"

namespace bs {

struct SpecialTokenFrame {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
  bool has_template = false;  // some processor adds tokens (TemplateProcessing, Bert, Roberta)
};

// `config` is the "post_processor" value (null → empty frame).
Result<SpecialTokenFrame> parse_post_processor(const json_util::Json& config,
                                               const json_util::JsonPath& at);

}  // namespace bs
