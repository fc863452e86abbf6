#include "models/blocks/draft_vocab.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

namespace bs {

Result<std::vector<int64_t>> read_int_tensor(const io::TensorInfo& t, const std::string& where) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kI64) {
    std::memcpy(out.data(), t.data, out.size() * sizeof(int64_t));
  } else if (t.dtype == DType::kI32) {
    std::vector<int32_t> tmp(out.size());
    std::memcpy(tmp.data(), t.data, tmp.size() * sizeof(int32_t));
    std::copy(tmp.begin(), tmp.end(), out.begin());
  } else {
    return InvalidArgument("{}: tensor '{}' has dtype {}, expected I64 or I32", where, t.name,
                           dtype_name(t.dtype));
  }
  return out;
}

Result<std::vector<int32_t>> load_draft_vocab(const std::string& dir, const io::Checkpoint& ckpt,
                                              WeightLoader& r, const DraftVocabSource& src) {
  const int64_t V = src.vocab_size, Vd = src.draft_vocab_size;
  const Result<std::string> d2t_name = r.resolve({"d2t"});
  const bool has_d2t = d2t_name.ok();
  const std::string d2t_full = has_d2t ? *d2t_name : "d2t";
  std::vector<int64_t> hot;  // target ids in draft-id order
  if (Vd == V) {
    if (!has_d2t) return std::vector<int32_t>{};
    // Trainers keep d2t as a buffer and save zeros when the vocabulary is not restricted.
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, ckpt.get(d2t_full));
    if (t->shape == std::vector<int64_t>{V}) {
      BS_ASSIGN_OR_RETURN(std::vector<int64_t> d2t, read_int_tensor(*t, ckpt.dir()));
      if (std::all_of(d2t.begin(), d2t.end(), [](int64_t o) { return o == 0; })) {
        r.mark_used(d2t_full);
        return std::vector<int32_t>{};
      }
    }
    return InvalidArgument(
        "{}: tensor '{}' {} is present but draft_vocab_size equals vocab_size ({}): set "
        "draft_vocab_size to its length",
        ckpt.dir(), d2t_full, io::shape_to_string(t->shape), V);
  }
  if (has_d2t) {
    // EAGLE-3 offsets: target id of draft id j = j + d2t[j].
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* t, ckpt.get(d2t_full));
    if (t->shape != std::vector<int64_t>{Vd}) {
      return InvalidArgument("{}: tensor '{}' has shape {}, expected [draft_vocab_size = {}]",
                             ckpt.dir(), d2t_full, io::shape_to_string(t->shape), Vd);
    }
    r.mark_used(d2t_full);
    BS_ASSIGN_OR_RETURN(std::vector<int64_t> d2t, read_int_tensor(*t, ckpt.dir()));
    for (int64_t j = 0; j < Vd; ++j) hot.push_back(j + d2t[j]);
  } else {
    // A release folder's draft_vocab.safetensors: target ids, most frequent first.
    const std::string path = (std::filesystem::path(dir) / "draft_vocab.safetensors").string();
    if (!src.release_file || !std::filesystem::exists(path)) {
      return NotFound(
          "{}: draft_vocab_size {} < vocab_size {} needs a draft vocabulary: tensor 'd2t' [{}] in "
          "the checkpoint{}",
          dir, Vd, V, Vd, src.release_file ? " or draft_vocab.safetensors with 'ids'" : "");
    }
    BS_ASSIGN_OR_RETURN(io::Checkpoint dv, io::Checkpoint::open_file(path));
    BS_ASSIGN_OR_RETURN(const io::TensorInfo* ids_t, dv.get("ids"));
    if (ids_t->shape.size() != 1 || ids_t->shape[0] < Vd) {
      return InvalidArgument("{}: tensor 'ids' has shape {}, expected [n >= draft_vocab_size = {}]",
                             path, io::shape_to_string(ids_t->shape), Vd);
    }
    BS_ASSIGN_OR_RETURN(std::vector<int64_t> ids, read_int_tensor(*ids_t, path));
    hot.assign(ids.begin(), ids.begin() + Vd);
    std::sort(hot.begin(), hot.end());
  }
  std::vector<uint8_t> seen(static_cast<size_t>(V), 0);
  std::vector<int32_t> out;
  for (size_t j = 0; j < hot.size(); ++j) {
    if (hot[j] < 0 || hot[j] >= V || seen[hot[j]]) {
      return InvalidArgument(
          "{}: the draft vocabulary ({}) must be distinct token ids in [0, vocab_size = {}); "
          "entry {} is {}",
          dir, has_d2t ? "'" + d2t_full + "': target id = j + d2t[j]" : "draft_vocab.safetensors",
          V, j, hot[j]);
    }
    seen[hot[j]] = 1;
    out.push_back(static_cast<int32_t>(hot[j]));
  }
  return out;
}

}  // namespace bs
