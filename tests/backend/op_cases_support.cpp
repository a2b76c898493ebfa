// The op-test case tables: every Backend op with Kev's real shapes (0.8B: d 1024, F 3584, attention
// 8/2/256, GDN 16/16 heads; 4B: d 2560, attention 16/4/256, GDN 16/32 heads; dk = dv = 128, conv
// K = 4, n_rot 64 of 256) and small shapes for the edge cases, with realistic input domains.
//
// Tolerances (NMSE against the double-precision reference, FP32 operands):
//   1e-12  element-wise maps and copies (one or two roundings per element);
//   1e-10  row reductions and dot products (norms, matmul, conv, pointer head, rope, attention):
//          FP32 accumulation over up to a few thousand terms;
//   1e-9   the gated delta rule: chunked FP32 WY form (triangular solve, four GEMMs per chunk)
//          against the token-by-token double recurrence, errors compounding through the state.
// Observed NMSE is 1e-16..1e-13 for these cases on x86-64 with OpenBLAS 0.3.21, so the bounds leave
// two to three orders of magnitude of headroom for other BLAS builds and thread counts while still
// catching any indexing or masking error (those give NMSE of 1e-4 and above).
#include <cmath>

#include "backend/op_harness.h"

namespace kev::optest {

namespace {

constexpr double kTolElementwise = 1e-12;
constexpr double kTolReduction = 1e-10;
constexpr double kTolGdn = 1e-9;

// ---- gathers ------------------------------------------------------------------------------------
void add_gathers(std::vector<OpCase>& cases) {
  struct E {
    int64_t V, d, n;
    DType dt;
  };
  for (const E& e : {E{1000, 1024, 17, DType::F32}, E{500, 2560, 9, DType::BF16}, E{64, 256, 1, DType::F32}}) {
    OpCase c{OpKind::Embedding,
             "V=" + std::to_string(e.V) + ",d=" + std::to_string(e.d) + ",n=" + std::to_string(e.n) +
                 ",table=" + dtype_name(e.dt),
             {in("table", {e.V, e.d}, normal(0, 0.02), e.dt), in("ids", {e.n}, indices(e.V), DType::I32),
              out("out", {e.n, e.d})},
             kTolElementwise,
             [](Backend& b, const std::vector<Tensor>& t) { return b.embedding(t[0], t[1], t[2]); }};
    cases.push_back(c);
  }
  OpCase g{OpKind::GatherRows,
           "n=100,d=1024,m=13,strided",
           {padded(in("x", {100, 1024}, normal()), 0, 24), in("idx", {13}, indices(100), DType::I32),
            padded(out("out", {13, 1024}), 8, 0)},
           kTolElementwise,
           [](Backend& b, const std::vector<Tensor>& t) { return b.gather_rows(t[0], t[1], t[2]); }};
  cases.push_back(g);
}

// ---- norms --------------------------------------------------------------------------------------
void add_norms(std::vector<OpCase>& cases) {
  const float eps = 1e-6f;
  auto rms = [&](std::string params, std::vector<int64_t> shape, int64_t pad, bool in_place) {
    const int64_t d = shape.back();
    OpCase c{OpKind::RmsNorm, std::move(params), {}, kTolReduction, nullptr};
    if (in_place) {
      ArgSpec x = padded(in("x", shape, normal(0.3, 2.0)), 0, pad);
      x.role = Role::InOut;
      c.args = {x, in("w", {d}, normal(0, 0.1))};
      c.run = [=](Backend& b, const std::vector<Tensor>& t) { return b.rms_norm(t[0], t[1], eps, t[0]); };
      c.desc = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0], t[1], t[0]}; };
    } else {
      c.args = {padded(in("x", shape, normal(0.3, 2.0)), 0, pad), in("w", {d}, normal(0, 0.1)), out("out", shape)};
      c.run = [=](Backend& b, const std::vector<Tensor>& t) { return b.rms_norm(t[0], t[1], eps, t[2]); };
    }
    cases.push_back(c);
  };
  rms("n=64,d=1024", {64, 1024}, 0, false);
  rms("n=7,d=2560", {7, 2560}, 0, false);
  rms("q_norm,n=16,H=8,hd=256,view_of_512", {16, 8, 256}, 256, false);
  rms("in_place,n=5,H=2,hd=256", {5, 2, 256}, 0, true);
  // Row lengths around the kernels' lane and run sizes (WebGPU: 64 lanes a row, runs of 16), in place,
  // a view.
  rms("odd,n=3,H=3,d=37", {3, 3, 37}, 0, false);
  rms("view,n=13,d=200", {13, 200}, 8, false);
  rms("in_place,n=9,d=129", {9, 129}, 0, true);
  rms("n=3,d=257", {3, 257}, 0, false);

  // The residual add fused with the next norm: x (updated in place) and its normed copy. Views with a
  // float4-aligned row stride keep the CUDA wide-row kernel; pads of 1 and 3 force its scalar path.
  auto add_rms = [&](std::string params, std::vector<int64_t> shape, int64_t x_pad, int64_t y_pad, int64_t out_pad) {
    const int64_t d = shape.back();
    ArgSpec x = padded(in("x", shape, normal(0.3, 2.0)), 0, x_pad);
    x.role = Role::InOut;
    OpCase c{OpKind::AddRmsNorm,
             std::move(params),
             {x, padded(in("y", shape, normal(0, 1.0)), y_pad, 0), in("w", {d}, normal(0, 0.1)),
              padded(out("out", shape), 0, out_pad)},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) { return b.add_rms_norm(t[0], t[1], t[2], eps, t[3]); }};
    cases.push_back(c);
  };
  add_rms("residual_0.8b,n=64,d=1024", {64, 1024}, 0, 0, 0);
  add_rms("residual_4b,n=7,d=2560", {7, 2560}, 0, 0, 0);
  add_rms("views,n=5,d=2560", {5, 2560}, 8, 4, 4);
  add_rms("unaligned_views,n=6,d=1024", {6, 1024}, 1, 3, 0);
  add_rms("rank3,n=11,H=2,d=256", {11, 2, 256}, 0, 0, 0);
  add_rms("wide,n=3,d=4100", {3, 4100}, 0, 0, 0);
  add_rms("odd,n=4,d=33", {4, 33}, 0, 0, 0);

  auto l2 = [&](std::string params, std::vector<int64_t> shape, int64_t front, int64_t back, float scale) {
    OpCase c{OpKind::L2Norm,
             std::move(params),
             {padded(in("x", shape, normal(0, 1.5)), front, back), out("out", shape)},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) { return b.l2_norm(t[0], eps, scale, t[1]); }};
    cases.push_back(c);
  };
  l2("q,n=20,Hk=16,dk=128,scale=1/sqrt(128),view", {20, 16, 128}, 0, 0, 1.0f / std::sqrt(128.0f));
  l2("k,n=33,Hk=16,dk=128,scale=1", {33, 16, 128}, 0, 0, 1.0f);
  l2("rank2,n=9,d=128", {9, 128}, 64, 32, 1.0f);
  // Around WebGPU's short-row kernel (rows of at most 256, eight a workgroup): a row count that is not
  // a multiple of 8, rows shorter than a lane's run, one run past 128, and the one-row kernel at 257.
  l2("short_odd,n=5,H=3,d=130,scale=0.5", {5, 3, 130}, 0, 0, 0.5f);
  l2("short_two_runs,n=3,d=256", {3, 256}, 0, 0, 1.0f);
  l2("one_row_kernel,n=3,d=257", {3, 257}, 8, 0, 1.0f);
  l2("short_tiny,n=11,d=5", {11, 5}, 0, 0, 1.0f);

  auto gated = [&](std::string params, int64_t n, int64_t Hv, int64_t dv, int64_t z_pad) {
    OpCase c{OpKind::RmsNormGated,
             std::move(params),
             {in("o", {n, Hv, dv}, normal(0, 0.5)), padded(in("z", {n, Hv, dv}, normal(0, 2)), 0, z_pad),
              in("w", {dv}, normal(1.0, 0.1)), out("out", {n, Hv, dv})},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) { return b.rms_norm_gated(t[0], t[1], t[2], eps, t[3]); }};
    cases.push_back(c);
  };
  gated("n=40,Hv=16,dv=128", 40, 16, 128, 0);
  gated("n=9,Hv=32,dv=128,z_view", 9, 32, 128, 128);
  gated("n=3,Hv=3,dv=256,z_view", 3, 3, 256, 8);
  gated("n=7,Hv=1,dv=300", 7, 1, 300, 0);
}

// ---- matmul -------------------------------------------------------------------------------------
void add_matmul(std::vector<OpCase>& cases) {
  struct M {
    std::string name;
    int64_t n, k, m;
    bool bias;
    int64_t x_pad, out_pad;
  };
  const M table[] = {
      {"mlp_up_0.8b", 33, 1024, 3584, false, 0, 0},
      {"head_q_4b", 7, 2560, 256, true, 0, 0},
      {"strided", 40, 300, 130, true, 12, 5},
      {"one_row", 1, 1024, 300, false, 0, 0},
      {"k=0", 5, 0, 17, true, 0, 0},
      // Row-invariant kernel edges: k off the 8-lane grid, m off the 4-column tiles and the 64-column
      // blocks, n across several 3-row tiles and row blocks (63 rows at k = 1030, 18 at k = 3584).
      {"ragged", 130, 1030, 67, true, 3, 2},
      {"mlp_down_0.8b", 40, 3584, 1024, false, 0, 0},
      {"o_proj_0.8b", 250, 2048, 1024, true, 0, 3},  // WebGPU: k split in pieces (matmul.wgsl)
      {"tiny", 4, 5, 3, true, 1, 0},
  };
  for (const M& mm : table) {
    OpCase c{OpKind::Matmul,
             mm.name + ",n=" + std::to_string(mm.n) + ",k=" + std::to_string(mm.k) + ",m=" + std::to_string(mm.m) +
                 (mm.bias ? ",bias" : ""),
             {padded(in("x", {mm.n, mm.k}, normal()), 0, mm.x_pad), in("w", {mm.m, mm.k}, normal(0, 0.03)),
              mm.bias ? in("bias", {mm.m}, normal()) : absent("bias"), padded(out("out", {mm.n, mm.m}), mm.out_pad, 0)},
             kTolReduction,
             [](Backend& b, const std::vector<Tensor>& t) { return b.matmul(t[0], t[1], t[2], t[3]); }};
    cases.push_back(c);
  }
}

// ---- causal conv --------------------------------------------------------------------------------
void add_conv(std::vector<OpCase>& cases) {
  struct C {
    int64_t C;
    std::vector<int64_t> seqs;
    bool prefix, state_out;
    int64_t x_pad;
  };
  const C table[] = {
      {6144, {64}, false, true, 0},           // 0.8B state pass
      {256, {1}, true, true, 0},              // shorter than K, from a prefix: state_out continues state_in
      {256, {2}, false, true, 0},             // shorter than K, fresh: zero-left-padded state_out
      {256, {3}, true, false, 0},             // K-1 tokens: every tap but the last reads the prefix
      {512, {1, 3, 7, 20}, true, false, 96},  // packed rows from one prefix, x a view of a projection
      {8192, {5, 40}, true, false, 0},        // 4B channels
      {128, {0, 4, 9}, false, false, 0},      // an empty sequence in the pack
  };
  for (const C& cc : table) cases.push_back(conv_case(cc.C, 4, cc.seqs, cc.prefix, cc.state_out, cc.x_pad));
  // Channels not a multiple of 4 (kernels that take channels four at a time mask the last group), and
  // kernel sizes other than the model's 4 (WebGPU's generic tap loop).
  cases.push_back(conv_case(258, 4, {5, 0, 30, 1}, true, false, 0));
  cases.push_back(conv_case(66, 6, {3, 20}, true, false, 0));
  cases.push_back(conv_case(30, 3, {9}, false, true, 0));
}

// ---- gated delta rule ---------------------------------------------------------------------------
void add_gdn(std::vector<OpCase>& cases) {
  const GdnShape small{2, 4, 128, 128};  // GQA ratio 2 like the 4B, fewer heads to keep the reference fast
  for (int64_t T : {1, 63, 64, 65, 130, 200}) {
    for (bool prefix : {false, true}) cases.push_back(gdn_case("", small, {T}, prefix, true));
  }
  cases.push_back(gdn_case("0.8b,", {16, 16, 128, 128}, {64}, true, true));
  cases.push_back(gdn_case("4b,", {16, 32, 128, 128}, {130}, true, true));
  cases.push_back(gdn_case("packed,", small, {1, 7, 64, 65, 130}, true, false, 64));
  cases.push_back(gdn_case("packed,", small, {3, 70}, false, false));
  cases.push_back(gdn_case("rows,", small, {37, 20, 64, 1}, true, false));  // question rows: every sequence one chunk
  cases.push_back(gdn_case("dk!=dv,", {1, 3, 32, 48}, {100}, true, true));
  cases.push_back(gdn_case("empty_seq,", small, {0}, true, true));
  OpCase spiky = gdn_case("spiky_decay,", small, {130}, true, true);
  spiky.args[3].init = spiky_log_decay();
  cases.push_back(spiky);

  // state_out as the identical view of state_in: the state pass updating a snapshot in place (a state
  // within one chunk, too: backends may take another kernel for it).
  for (int64_t T : {70, 40}) {
    OpCase c = gdn_case("in_place_state,", small, {T}, true, false);
    c.args[5].role = Role::InOut;
    c.args.pop_back();
    const SeqLayout layout = layout_of({T}, 0, true);
    c.run = [=](Backend& b, const std::vector<Tensor>& t) {
      return b.gated_delta_rule(t[0], t[1], t[2], t[3], t[4], t[5], layout, t[6], t[5]);
    };
    c.desc = [](const std::vector<Tensor>& t) {
      return std::vector<Tensor>{t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[5]};
    };
    cases.push_back(c);
  }
}

// ---- attention and rope -------------------------------------------------------------------------
void add_attention(std::vector<OpCase>& cases) {
  struct A {
    std::string tag;
    int64_t H, Hkv, Ls;
    std::vector<int64_t> seqs;
    bool prefix;
  };
  const A table[] = {
      {"0.8b,", 8, 2, 0, {70}, false},       {"0.8b,", 8, 2, 1, {5}, true},
      {"0.8b,", 8, 2, 31, {1, 7, 64}, true}, {"0.8b,", 8, 2, 200, {65, 3}, true},
      {"4b,", 16, 4, 31, {20}, true},        {"fresh_packed,", 8, 2, 0, {9, 1, 40}, false},
  };
  const int64_t hd = 256;
  for (const A& a : table) {
    int64_t n = 0;
    for (int64_t l : a.seqs) n += l;
    const SeqLayout layout = layout_of(a.seqs, a.Ls, a.prefix);
    const bool has_prefix = a.Ls > 0;
    OpCase c{OpKind::Attention,
             a.tag + "H=" + std::to_string(a.H) + ",Hkv=" + std::to_string(a.Hkv) +
                 ",hd=256,Ls=" + std::to_string(a.Ls) + ",seqs=" + lengths_str(a.seqs) + ",q_view",
             // q is the query half of q_proj's [n,H,2·hd] output; k, v columns of their projections.
             {padded(in("q", {n, a.H, hd}, normal(0, 2)), 0, hd), in("k", {n, a.Hkv, hd}, normal(0, 2)),
              in("v", {n, a.Hkv, hd}, normal()),
              has_prefix ? in("prefix_k", {a.Ls, a.Hkv, hd}, normal(0, 2)) : absent("prefix_k"),
              has_prefix ? in("prefix_v", {a.Ls, a.Hkv, hd}, normal()) : absent("prefix_v"),
              padded(out("out", {n, a.H, hd}), 0, 16)},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) {
               return b.attention(t[0], t[1], t[2], t[3], t[4], layout, 1.0f / 16.0f, t[5]);
             }};
    cases.push_back(c);
  }

  struct R {
    int64_t H, pos0, pad;
    std::vector<int64_t> seqs;
  };
  const R ropes[] = {{8, 5000, 256, {3, 17, 40}}, {2, 0, 0, {100}}, {8, 70000, 256, {12}}, {16, 31, 0, {1, 2}}};
  for (const R& r : ropes) {
    int64_t n = 0;
    for (int64_t l : r.seqs) n += l;
    const SeqLayout layout = layout_of(r.seqs, r.pos0, true);
    ArgSpec x = padded(in("x", {n, r.H, 256}, normal(0, 1.5)), 0, r.pad);
    x.role = Role::InOut;
    OpCase c{OpKind::Rope,
             "H=" + std::to_string(r.H) + ",hd=256,n_rot=64,theta=1e7,pos0=" + std::to_string(r.pos0) +
                 ",seqs=" + lengths_str(r.seqs) + (r.pad ? ",view" : ""),
             {x},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) { return b.rope(t[0], layout, 64, 1e7); }};
    cases.push_back(c);
  }
}

// ---- element-wise, gates, head, copy --------------------------------------------------------------
void add_elementwise(std::vector<OpCase>& cases) {
  {
    // b, a are columns of the fused in_proj output in the model: views with row padding.
    const int64_t n = 50, Hv = 32;
    OpCase c{
        OpKind::GdnGates,
        "n=50,Hv=32,views",
        {padded(in("b", {n, Hv}, normal(0, 3)), 0, Hv), padded(in("a", {n, Hv}, normal(0, 8)), Hv, 0),
         in("a_log", {Hv}, normal(0, 1)), in("dt_bias", {Hv}, normal(0, 1)), out("beta", {n, Hv}), out("g", {n, Hv})},
        kTolElementwise,
        [](Backend& b, const std::vector<Tensor>& t) { return b.gdn_gates(t[0], t[1], t[2], t[3], t[4], t[5]); }};
    cases.push_back(c);
  }
  auto binary = [&](OpKind kind, std::string params, std::vector<int64_t> shape, int64_t x_front, int64_t y_front,
                    int64_t pad, bool in_place) {
    OpCase c{kind, std::move(params), {}, kTolElementwise, nullptr};
    ArgSpec x = padded(in("x", shape, normal(0, 2)), x_front, pad - x_front);
    ArgSpec y = padded(in("y", shape, normal(0, 2)), y_front, pad - y_front);
    auto call = [kind](Backend& b, const Tensor& x, const Tensor& y, const Tensor& o) {
      if (kind == OpKind::SigmoidMul) return b.sigmoid_mul(x, y, o);
      if (kind == OpKind::Swiglu) return b.swiglu(x, y, o);
      return b.add(x, y, o);
    };
    if (in_place) {
      x.role = Role::InOut;
      c.args = {x, y};
      c.run = [=](Backend& b, const std::vector<Tensor>& t) { return call(b, t[0], t[1], t[0]); };
      c.desc = [](const std::vector<Tensor>& t) { return std::vector<Tensor>{t[0], t[1], t[0]}; };
    } else {
      c.args = {x, y, out("out", shape)};
      c.run = [=](Backend& b, const std::vector<Tensor>& t) { return call(b, t[0], t[1], t[2]); };
    }
    cases.push_back(c);
  };
  // The attention output gate is the second half of each head's q_proj row.
  binary(OpKind::SigmoidMul, "attn_gate,n=30,H=8,hd=256,gate_view", {30, 8, 256}, 0, 256, 256, false);
  binary(OpKind::Swiglu, "n=16,F=3584", {16, 3584}, 0, 0, 0, false);
  binary(OpKind::Swiglu, "n=3,F=9216,in_place", {3, 9216}, 0, 0, 0, true);
  binary(OpKind::Add, "residual,n=16,d=1024", {16, 1024}, 0, 0, 0, false);
  binary(OpKind::Add, "residual,n=4,d=2560,in_place", {4, 2560}, 0, 0, 0, true);

  {
    const int64_t Q = 3, P = 256, M = 11;
    const float scale = static_cast<float>(1.0 / 16.0 / 2.35);
    OpCase c{OpKind::PointerLogits,
             "Q=3,P=256,M=11,scale=1/16/2.35",
             {in("u", {Q, P}, normal()), padded(in("kappa", {M, P}, normal()), 0, 8),
              in("question", {M}, indices(Q), DType::I32), out("out", {M})},
             kTolReduction,
             [=](Backend& b, const std::vector<Tensor>& t) { return b.pointer_logits(t[0], t[1], t[2], scale, t[3]); }};
    cases.push_back(c);
  }
  struct Cp {
    DType from, to;
    int64_t pad;
  };
  // F32 → F32 with rows whose stride is a multiple of 4 floats takes CUDA's float4 copy.
  for (const Cp& cp : {Cp{DType::F32, DType::F32, 7}, Cp{DType::F32, DType::F32, 4}, Cp{DType::F32, DType::BF16, 0},
                       Cp{DType::BF16, DType::F32, 3}, Cp{DType::BF16, DType::BF16, 0}}) {
    OpCase c{OpKind::Copy,
             std::string(dtype_name(cp.from)) + "->" + dtype_name(cp.to) + ",n=6,H=4,d=100" +
                 (cp.pad ? ",row pad " + std::to_string(cp.pad) : ""),
             {padded(in("x", {6, 4, 100}, normal(0, 100), cp.from), 0, cp.pad), out("out", {6, 4, 100}, cp.to)},
             kTolElementwise,
             [](Backend& b, const std::vector<Tensor>& t) { return b.copy(t[0], t[1]); }};
    cases.push_back(c);
  }
}

}  // namespace

OpCase gdn_case(const std::string& tag, GdnShape s, const std::vector<int64_t>& seqs, bool prefix, bool state_out,
                int64_t qk_pad) {
  int64_t n = 0;
  for (int64_t l : seqs) n += l;
  const SeqLayout layout = layout_of(seqs, 0, prefix);
  const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.dk)));
  OpCase c{OpKind::GatedDeltaRule,
           tag + "Hk=" + std::to_string(s.Hk) + ",Hv=" + std::to_string(s.Hv) + ",dk=" + std::to_string(s.dk) +
               ",dv=" + std::to_string(s.dv) + ",seqs=" + lengths_str(seqs) + (prefix ? ",state=random" : ",state=0") +
               (state_out ? ",state_out" : "") + (qk_pad ? ",qk_view" : ""),
           {padded(in("q", {n, s.Hk, s.dk}, l2_rows(qscale)), 0, qk_pad),
            padded(in("k", {n, s.Hk, s.dk}, l2_rows(1.0)), 0, qk_pad), in("v", {n, s.Hv, s.dv}, normal()),
            in("g", {n, s.Hv}, log_decay()), in("beta", {n, s.Hv}, uniform(0.0, 1.0)),
            prefix ? in("state_in", {s.Hv, s.dk, s.dv}, normal(0, 0.3)) : absent("state_in"),
            out("out", {n, s.Hv, s.dv}), state_out ? out("state_out", {s.Hv, s.dk, s.dv}) : absent("state_out")},
           kTolGdn,
           [=](Backend& b, const std::vector<Tensor>& t) {
             return b.gated_delta_rule(t[0], t[1], t[2], t[3], t[4], t[5], layout, t[6], t[7]);
           }};
  return c;
}

OpCase conv_case(int64_t C, int64_t K, const std::vector<int64_t>& seqs, bool prefix, bool state_out, int64_t x_pad) {
  int64_t n = 0;
  for (int64_t s : seqs) n += s;
  const SeqLayout layout = layout_of(seqs, 0, prefix);
  return OpCase{OpKind::CausalConv1dSilu,
                "C=" + std::to_string(C) + ",K=" + std::to_string(K) + ",seqs=" + lengths_str(seqs) +
                    (prefix ? ",prefix" : ",fresh") + (state_out ? ",state_out" : "") + (x_pad ? ",x_view" : ""),
                {padded(in("x", {n, C}, normal(0, 1.5)), 0, x_pad), in("w", {C, K}, normal(0, 0.5)),
                 prefix ? in("state_in", {C, K}, normal(0, 1.5)) : absent("state_in"), out("out", {n, C}),
                 state_out ? out("state_out", {C, K}) : absent("state_out")},
                kTolReduction,
                [=](Backend& b, const std::vector<Tensor>& t) {
                  return b.causal_conv1d_silu(t[0], t[1], t[2], layout, t[3], t[4]);
                }};
}

const std::vector<OpCase>& all_op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> c;
    add_gathers(c);
    add_norms(c);
    add_matmul(c);
    add_conv(c);
    add_gdn(c);
    add_attention(c);
    add_elementwise(c);
    return c;
  }();
  return cases;
}

}  // namespace kev::optest
