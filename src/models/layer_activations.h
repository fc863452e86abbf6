// Activations of one pass of a Qwen3 / Llama-style decoder layer stack over `rows` rows: the
// buffers the target decoder and the DFlash drafter (the same layer shape) run their layers in.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "io/hf_config.h"

namespace bs {

struct LayerActivations {
  Tensor x, xn;    // [rows, hidden]: residual stream, normed
  Tensor qkv;      // [rows, (heads + 2 kv_heads) * hd]
  Tensor q, attn;  // [rows, heads, hd]
  Tensor gate_up;  // [rows, 2 * inter]
  Tensor act;      // [rows, inter]

  void allocate_layers(Backend& backend, const io::TransformerConfig& c, int64_t rows) {
    x = backend.empty({rows, c.hidden_size});
    xn = backend.empty({rows, c.hidden_size});
    qkv = backend.empty({rows, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim});
    q = backend.empty({rows, c.num_heads, c.head_dim});
    attn = backend.empty({rows, c.num_heads, c.head_dim});
    gate_up = backend.empty({rows, 2 * c.intermediate_size});
    act = backend.empty({rows, c.intermediate_size});
  }
};

}  // namespace bs
