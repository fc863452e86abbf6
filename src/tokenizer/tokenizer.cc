#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode.h"

namespace bs {

using json_util::Json;
using json_util::JsonPath;

namespace {

const Json& member_or_null(const Json& obj, std::string_view key) {
  static const Json kNull;
  const Json* j = json_util::member(obj, key);
  return j == nullptr ? kNull : *j;
}

// Optional JSON file in `dir`: nullopt when absent, an error when unreadable or invalid.
Result<std::optional<Json>> read_optional_json(const std::string& path) {
  auto parsed = json_util::parse_json_file(path);
  if (parsed.ok()) return std::optional<Json>(std::move(parsed).value());
  if (parsed.status().code() == StatusCode::kNotFound) return std::optional<Json>();
  return parsed.status();
}

// "<s>", {"content": "<s>", ...} (serialized AddedToken) or null.
Result<std::optional<std::string>> special_token_name(const Json& j, const JsonPath& at) {
  if (j.is_null()) return std::optional<std::string>();
  if (j.is_string()) return std::optional<std::string>(j.get<std::string>());
  if (j.is_object()) {
    BS_ASSIGN_OR_RETURN(std::string content, json_util::require_string(j, "content", at));
    return std::optional<std::string>(std::move(content));
  }
  return at.error("must be a string, an object with \"content\", or null");
}

// bos_token_id / eos_token_id in config.json or generation_config.json: an int or a list.
Result<std::vector<int32_t>> token_id_list(const Json& j, const JsonPath& at) {
  std::vector<int32_t> ids;
  auto add = [&](const Json& v, const JsonPath& v_at) -> Status {
    BS_ASSIGN_OR_RETURN(int64_t id, json_util::as_int(v, v_at));
    if (id < 0 || id > INT32_MAX) return v_at.error("is not a valid token id");
    ids.push_back(static_cast<int32_t>(id));
    return Status::Ok();
  };
  if (j.is_null()) return ids;
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) BS_RETURN_IF_ERROR(add(j[i], at.index(i)));
  } else {
    BS_RETURN_IF_ERROR(add(j, at));
  }
  return ids;
}

}  // namespace

Tokenizer::Tokenizer(BpeModel model, Normalizer normalizer, PreTokenizer pre_tokenizer,
                     DecoderSpec decoder)
    : model_(std::move(model)),
      normalizer_(std::move(normalizer)),
      pre_tokenizer_(std::move(pre_tokenizer)),
      decoder_(std::move(decoder)) {}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  BS_ASSIGN_OR_RETURN(std::string text, json_util::read_file(path));
  return from_json(text, path, dir);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view text,
                                                        const std::string& path,
                                                        const std::string& dir) {
  BS_ASSIGN_OR_RETURN(TokenizerJson tj, parse_tokenizer_json(text, path));
  const JsonPath root{path, ""};
  const Json* model = json_util::member(tj.doc, "model");
  if (model == nullptr || !model->is_object()) {
    return root.child("model").error("must be an object");
  }
  BS_ASSIGN_OR_RETURN(std::string type,
                      json_util::get_string(*model, "type", root.child("model"), ""));
  if (type.empty() && tj.merges_captured) type = "BPE";
  if (type != "BPE") {
    return Unimplemented("{}: model type '{}' is not supported (only BPE is)", path,
                         type.empty() ? "<missing>" : type);
  }
  BS_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::build(tj, root.child("model")));
  BS_ASSIGN_OR_RETURN(
      Normalizer normalizer,
      Normalizer::from_json(member_or_null(tj.doc, "normalizer"), root.child("normalizer")));
  BS_ASSIGN_OR_RETURN(PreTokenizer pre_tokenizer,
                      PreTokenizer::from_json(member_or_null(tj.doc, "pre_tokenizer"),
                                              root.child("pre_tokenizer")));
  BS_ASSIGN_OR_RETURN(DecoderSpec decoder, DecoderSpec::from_json(member_or_null(tj.doc, "decoder"),
                                                                  root.child("decoder")));
  BS_ASSIGN_OR_RETURN(
      SpecialTokenFrame frame,
      parse_post_processor(member_or_null(tj.doc, "post_processor"), root.child("post_processor")));
  std::unique_ptr<Tokenizer> tok(new Tokenizer(std::move(bpe), std::move(normalizer),
                                               std::move(pre_tokenizer), std::move(decoder)));
  BS_RETURN_IF_ERROR(tok->init_added_tokens(tj.doc, root));
  tok->build_pieces();
  BS_RETURN_IF_ERROR(tok->init_special_config(dir, frame));
  return tok;
}

Status Tokenizer::init_added_tokens(const Json& doc, const JsonPath& root) {
  const JsonPath at = root.child("added_tokens");
  const Json* list = json_util::member(doc, "added_tokens");
  if (list == nullptr) return Status::Ok();
  if (!list->is_array()) return at.error("must be an array");
  std::vector<AddedToken> raw, normalized;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& item = (*list)[i];
    const JsonPath item_at = at.index(i);
    if (!item.is_object()) return item_at.error("must be an object");
    AddedToken t;
    const Json* id = json_util::member(item, "id");
    if (id == nullptr) return item_at.child("id").error("is missing");
    BS_ASSIGN_OR_RETURN(int64_t id64, json_util::as_int(*id, item_at.child("id")));
    if (id64 < 0 || id64 > kMaxTokenId) {
      return item_at.child("id").error(
          fmt::format("is {}: a token id must be in 0..{}", id64, kMaxTokenId));
    }
    t.id = static_cast<int32_t>(id64);
    BS_ASSIGN_OR_RETURN(t.content, json_util::require_string(item, "content", item_at));
    if (t.content.empty()) return item_at.child("content").error("must not be empty");
    BS_ASSIGN_OR_RETURN(t.special, json_util::get_bool(item, "special", item_at, false));
    BS_ASSIGN_OR_RETURN(t.single_word, json_util::get_bool(item, "single_word", item_at, false));
    BS_ASSIGN_OR_RETURN(t.lstrip, json_util::get_bool(item, "lstrip", item_at, false));
    BS_ASSIGN_OR_RETURN(t.rstrip, json_util::get_bool(item, "rstrip", item_at, false));
    BS_ASSIGN_OR_RETURN(t.normalized, json_util::get_bool(item, "normalized", item_at, !t.special));
    added_ids_.insert(t.content, t.id);
    if (t.normalized) {
      AddedToken n = t;
      n.content = normalizer_.apply(unicode::to_valid_utf8(t.content));
      if (!n.content.empty()) normalized.push_back(std::move(n));
    } else {
      raw.push_back(t);
    }
    added_tokens_.push_back(std::move(t));
  }
  raw_matcher_ = AddedTokenMatcher(raw);
  normalized_matcher_ = AddedTokenMatcher(normalized);
  return Status::Ok();
}

void Tokenizer::build_pieces() {
  int64_t max_id = model_.max_id();
  for (const AddedToken& t : added_tokens_) max_id = std::max<int64_t>(max_id, t.id);
  vocab_size_ = max_id + 1;
  const auto n = static_cast<size_t>(vocab_size_);
  pieces_.assign(n, DecodePiece{});
  known_.assign(n, 0);
  special_.assign(n, 0);
  for (int32_t id = 0; id <= model_.max_id(); ++id) {
    if (const auto token = model_.id_to_token(id)) {
      pieces_[id] = decoder_.make_piece(*token, /*added_token=*/false);
      known_[id] = 1;
    }
  }
  for (const AddedToken& t : added_tokens_) {
    pieces_[t.id] = decoder_.make_piece(t.content, /*added_token=*/true);
    known_[t.id] = 1;
    special_[t.id] = t.special ? 1 : 0;
  }
}

Status Tokenizer::init_special_config(const std::string& dir, const SpecialTokenFrame& frame) {
  const std::string tc_path = dir + "/tokenizer_config.json";
  BS_ASSIGN_OR_RETURN(std::optional<Json> tc, read_optional_json(tc_path));
  const JsonPath tc_at{tc_path, ""};
  if (tc && !tc->is_object()) return tc_at.error("must be an object");
  const Json empty = Json::object();
  const Json& cfg = tc ? *tc : empty;

  auto resolve = [&](const char* key) -> Result<std::optional<int32_t>> {
    BS_ASSIGN_OR_RETURN(std::optional<std::string> name,
                        special_token_name(cfg[key], tc_at.child(key)));
    if (!name) return std::optional<int32_t>();
    const std::optional<int32_t> id = token_to_id(*name);
    if (!id) {
      return tc_at.child(key).error(
          fmt::format("names '{}', which is not in the vocabulary", *name));
    }
    return id;
  };
  // Model configs, read only for what tokenizer_config.json does not say.
  auto fallback_ids = [&](const char* key) -> Result<std::vector<int32_t>> {
    for (const char* name : {"generation_config.json", "config.json"}) {
      const std::string p = dir + "/" + name;
      BS_ASSIGN_OR_RETURN(std::optional<Json> j, read_optional_json(p));
      if (!j) continue;
      if (const Json* v = json_util::member(*j, key)) return token_id_list(*v, JsonPath{p, key});
    }
    return std::vector<int32_t>();
  };

  if (cfg.contains("bos_token")) {
    BS_ASSIGN_OR_RETURN(std::optional<int32_t> bos, resolve("bos_token"));
    bos_id_ = bos.value_or(-1);
  } else {
    BS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, fallback_ids("bos_token_id"));
    bos_id_ = ids.empty() ? -1 : ids[0];
  }
  if (cfg.contains("eos_token")) {
    BS_ASSIGN_OR_RETURN(std::optional<int32_t> eos, resolve("eos_token"));
    if (eos) eos_ids_ = {*eos};
  } else {
    BS_ASSIGN_OR_RETURN(eos_ids_, fallback_ids("eos_token_id"));
  }
  for (int32_t id : eos_ids_) {
    if (id < 0 || id >= vocab_size_) {
      return InvalidArgument("{}: eos token id {} is outside the vocabulary (size {})", dir, id,
                             vocab_size_);
    }
  }
  if (bos_id_ >= vocab_size_) {
    return InvalidArgument("{}: bos token id {} is outside the vocabulary (size {})", dir, bos_id_,
                           vocab_size_);
  }
  BS_ASSIGN_OR_RETURN(clean_up_spaces_,
                      json_util::get_bool(cfg, "clean_up_tokenization_spaces", tc_at, false));
  if (const Json* extra = json_util::member(cfg, "additional_special_tokens")) {
    if (!extra->is_array())
      return tc_at.child("additional_special_tokens").error("must be an array");
    for (size_t i = 0; i < extra->size(); ++i) {
      const JsonPath at = tc_at.child("additional_special_tokens").index(i);
      BS_ASSIGN_OR_RETURN(std::optional<std::string> name, special_token_name((*extra)[i], at));
      if (!name) continue;
      if (auto id = token_to_id(*name)) special_[*id] = 1;
    }
  }

  // Special tokens around the text: the post-processor's, adjusted by explicit add_bos_token /
  // add_eos_token (as transformers' Llama/Gemma tokenizers rebuild their template from them).
  prefix_ids_ = frame.prefix;
  suffix_ids_ = frame.suffix;
  if (const Json* add_bos = json_util::member(cfg, "add_bos_token")) {
    BS_ASSIGN_OR_RETURN(bool on, json_util::as_bool(*add_bos, tc_at.child("add_bos_token")));
    std::erase(prefix_ids_, bos_id_);
    if (on && bos_id_ >= 0) prefix_ids_.insert(prefix_ids_.begin(), bos_id_);
  }
  if (const Json* add_eos = json_util::member(cfg, "add_eos_token")) {
    BS_ASSIGN_OR_RETURN(bool on, json_util::as_bool(*add_eos, tc_at.child("add_eos_token")));
    if (!eos_ids_.empty()) {
      std::erase(suffix_ids_, eos_ids_[0]);
      if (on) suffix_ids_.push_back(eos_ids_[0]);
    }
  }
  add_bos_ = bos_id_ >= 0 &&
             std::find(prefix_ids_.begin(), prefix_ids_.end(), bos_id_) != prefix_ids_.end();
  return Status::Ok();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + prefix_ids_.size() + suffix_ids_.size() + 4);
  if (add_special_tokens) ids = prefix_ids_;
  PreTokenizer::Scratch pre_scratch;
  BpeModel::Scratch bpe_scratch;
  std::vector<std::string_view> words;
  const bool raw = pre_tokenizer_.raw_byte_level();
  auto encode_words = [&](std::string_view section, bool first_section) {
    words.clear();
    pre_tokenizer_.apply(section, first_section, pre_scratch, words);
    for (const std::string_view w : words) model_.encode_word(w, raw, bpe_scratch, ids);
  };
  std::string normalized_storage;
  auto encode_plain = [&](std::string_view section, bool first_section) {
    if (section.empty()) return;
    std::string_view normalized = section;
    if (!normalizer_.is_identity()) {
      normalized_storage = normalizer_.apply(section);
      normalized = normalized_storage;
    }
    if (normalized_matcher_.empty()) {
      encode_words(normalized, first_section);
      return;
    }
    for (const auto& seg : normalized_matcher_.split(normalized)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
      } else {
        encode_words(normalized.substr(seg.begin, seg.end - seg.begin),
                     first_section && seg.begin == 0);
      }
    }
  };
  if (raw_matcher_.empty()) {
    encode_plain(text, true);
  } else {
    for (const auto& seg : raw_matcher_.split(text)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
      } else {
        encode_plain(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void Tokenizer::decode_one(int32_t id, bool skip_special_tokens, DecodeState& state,
                           std::string& out) const {
  if (id < 0 || id >= vocab_size_ || !known_[id]) return;
  if (skip_special_tokens && special_[id]) return;
  state.push(pieces_[id], out);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  DecodeState state(decoder_, clean_up_spaces_);
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) decode_one(id, skip_special_tokens, state, out);
  state.finish(out);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const int32_t id = added_ids_.find(token);
  if (id >= 0) return id;
  return model_.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size_ || !known_[id]) return std::nullopt;
  for (const AddedToken& t : added_tokens_) {
    if (t.id == id) return t.content;
  }
  const auto token = model_.id_to_token(id);
  return token ? std::optional<std::string>(*token) : std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_[id] != 0;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                             std::span<const int32_t> context)
    : tokenizer_(&tokenizer),
      skip_special_tokens_(skip_special_tokens),
      state_(tokenizer.decoder_, tokenizer.clean_up_spaces_) {
  if (!context.empty()) add_context(context);
}

std::string StreamDecoder::push(int32_t id) {
  std::string out;
  tokenizer_->decode_one(id, skip_special_tokens_, state_, out);
  drop_context_text(out);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  state_.finish(out);
  drop_context_text(out);
  state_ = DecodeState(tokenizer_->decoder_, tokenizer_->clean_up_spaces_);
  context_held_.clear();
  return out;
}

void StreamDecoder::add_context(std::span<const int32_t> ids) {
  std::string dropped;
  for (const int32_t id : ids) {
    tokenizer_->decode_one(id, skip_special_tokens_, state_, dropped);
    dropped.clear();
  }
  DecodeState end = state_;  // what a decode of the context alone would still give
  context_held_.clear();
  end.finish(context_held_);
}

void StreamDecoder::drop_context_text(std::string& out) {
  if (context_held_.empty() || out.empty()) return;
  const size_t n = std::min(out.size(), context_held_.size());
  if (out.compare(0, n, context_held_, 0, n) == 0) {
    out.erase(0, n);
    context_held_.erase(0, n);
  } else {
    context_held_.clear();  // the continuation changed it: the new text is the continuation's
  }
}

}  // namespace bs
