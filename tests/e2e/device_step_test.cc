// The greedy speculative step on the device: the verify forward reads its tokens from the device
// (ForwardRequest::device_tokens gives what host tokens give, bit for bit).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/kv_cache.h"
#include "models/registry.h"

namespace bs {
namespace {

const std::string kModels = std::string(BS_SOURCE_DIR) + "/models";

Tensor ints(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = be.empty({static_cast<int64_t>(v.size())}, DType::kI32);
  be.copy_from_host(t, v.data());
  return t;
}

TEST(DeviceTokens, ForwardEqualsHostTokens) {
  auto be = make_cpu_backend(1);
  auto t = load_target(kModels + "/stories260K", *be);
  ASSERT_TRUE(t.ok()) << t.status().message();
  CausalLM& target = **t;
  const std::vector<std::vector<int32_t>> seqs = {
      {1, 403, 407, 261, 378}, {1, 291, 376}, {1, 274, 287, 381, 261, 352, 266}};
  const int64_t blocks_per_seq = 2;
  KvPool pool = target.make_kv_pool(blocks_per_seq * static_cast<int64_t>(seqs.size()));
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    tables[i] = {static_cast<int32_t>(2 * i), static_cast<int32_t>(2 * i + 1)};
  }
  const std::vector<int> taps = {0, 2};
  // Every mix of host and device tokens over the three sequences (0: all on the host).
  std::vector<float> reference_logits, reference_taps;
  for (int mask = 0; mask < 8; ++mask) {
    std::vector<ForwardRequest> reqs;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ForwardRequest req{.tokens = seqs[i],
                         .start_pos = 0,
                         .block_table = tables[i],
                         .num_logits = static_cast<int64_t>(seqs[i].size()),
                         .tap_layers = taps};
      if (mask & (1 << i)) {
        req.tokens = {};  // nothing on the host: the forward must take the device's
        req.device_tokens = ints(*be, seqs[i]);
      }
      reqs.push_back(req);
    }
    BatchForwardResult res;
    ASSERT_TRUE(target.forward_batch(reqs, pool, &res).ok());
    std::vector<float> logits = be->to_host_f32(res.logits), tap_values;
    for (const ForwardResult& r : res.seqs) {
      const auto v = be->to_host_f32(r.taps);
      tap_values.insert(tap_values.end(), v.begin(), v.end());
    }
    if (mask == 0) {
      reference_logits = logits;
      reference_taps = tap_values;
      continue;
    }
    EXPECT_EQ(logits, reference_logits) << "mask " << mask;
    EXPECT_EQ(tap_values, reference_taps) << "mask " << mask;
  }
  // One sequence through forward().
  ForwardResult host, device;
  ASSERT_TRUE(
      target
          .forward({.tokens = seqs[0], .start_pos = 0, .block_table = tables[0], .num_logits = 2},
                   pool, &host)
          .ok());
  const std::vector<float> host_logits = be->to_host_f32(host.logits);
  ForwardRequest req{.start_pos = 0, .block_table = tables[0], .num_logits = 2};
  req.device_tokens = ints(*be, seqs[0]);
  ASSERT_TRUE(target.forward(req, pool, &device).ok());
  EXPECT_EQ(be->to_host_f32(device.logits), host_logits);
  // A device tensor of the wrong type is refused.
  req.device_tokens = be->empty({5}, DType::kF32);
  EXPECT_EQ(target.forward(req, pool, &device).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bs
