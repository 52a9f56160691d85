// Host side of the emulated CUDA run: the same launch sequence as src/cuda/device.rs
// (fwd_dev, then bwd_dev), on the geometry the Rust side computed (`racelab::cuda::geometry`).
// Reads one problem from argv[1], writes o, den, dq, dk, dv (f32) and dbeta (f64) to argv[2].
// Output buffers start as NaN, so an element no kernel wrote shows up.

// A device buffer of n floats: NaN (so an element no kernel writes shows up), then a guard zone.
static std::vector<float> nans(size_t n) {
    std::vector<float> v(n + GUARD, std::numeric_limits<float>::quiet_NaN());
    guard_fill(v.data() + n);
    return v;
}
#define CHECK_GUARD(v, n) guard_check((v).data() + (n), #v)

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) return 2;
    int32_t hd[19];
    float beta;
    if (std::fread(hd, 4, 19, f) != 19 || std::fread(&beta, 4, 1, f) != 1) return 2;
    const int heads = hd[0], n = hd[1], d = hd[2], dv = hd[3], L = hd[4], P = hd[5], causal = hd[6];
    const int warps = hd[7], chunk = hd[8], bf16 = hd[9], sh_private = hd[10], sh_block = hd[11];
    const int tiled = hd[12], sh_tile = hd[13], sh_tile_state = hd[14];
    const int tiled_causal = hd[15] && causal, sh_causal = hd[16];
    const int sh_tile_query = hd[17], sh_causal_query = hd[18];
#ifdef RACE_BF16
    if (!bf16) return 4;
#else
    if (bf16) return 4;
#endif
    const int m = L << P, w = dv + 1, mw = m * w, nch = (n + chunk - 1) / chunk;
    const size_t nd = (size_t)heads * n * d, nv = (size_t)heads * n * dv, nt = (size_t)heads * n;
    std::vector<float> W((size_t)L * P * d), G(nv);
    std::vector<in_t> Q(nd), K(nd), V(nv);
    bool ok = std::fread(W.data(), 4, W.size(), f) == W.size() &&
              std::fread(Q.data(), sizeof(in_t), nd, f) == nd && std::fread(K.data(), sizeof(in_t), nd, f) == nd &&
              std::fread(V.data(), sizeof(in_t), nv, f) == nv && std::fread(G.data(), 4, nv, f) == nv;
    std::fclose(f);
    if (!ok) return 2;
    // NaN past the end of every input: a read beyond it shows up in the results.
#ifdef RACE_BF16
    const in_t nan_in = 0x7fc0;
#else
    const in_t nan_in = std::numeric_limits<float>::quiet_NaN();
#endif
    for (auto* x : {&Q, &K, &V}) x->resize(x->size() + GUARD, nan_in);
    W.resize(W.size() + GUARD, std::numeric_limits<float>::quiet_NaN());
    G.resize(G.size() + GUARD, std::numeric_limits<float>::quiet_NaN());

    // Warp-per-chunk launches, the tiled ones (chunk totals; the non-causal passes) and the
    // tiled causal ones, exactly as device.rs chooses them.
    const unsigned bx = (unsigned)((nch + warps - 1) / warps), threads = 32u * warps;
    const size_t shp = sh_private, shb = causal ? sh_private : sh_block;
    const bool tile_pass = tiled && !causal;
    const unsigned scan_bx = (unsigned)((mw + 255) / 256);
    std::vector<float> dummy(1, 0.f);
    // Forward.
    auto partials = nans((size_t)heads * nch * mw);
    auto totals = [&](const in_t* X, const in_t* Vv, const float* Gg, const float* Oo, const float* Dd, float* out,
                      int mode) {
        if (tiled)
            launch(nch, heads, 256, sh_tile,
                   [&] {
                       if (m <= 16) race_partial_tile_m16(X, Vv, Gg, Oo, Dd, W.data(), out, n, d, dv, L, P, beta, chunk, mode);
                       else race_partial_tile(X, Vv, Gg, Oo, Dd, W.data(), out, n, d, dv, L, P, beta, chunk, mode);
                   });
        else
            launch(bx, heads, threads, shp,
                   [&] { race_partial(X, Vv, Gg, Oo, Dd, W.data(), out, n, d, dv, L, P, beta, chunk, mode); });
    };
    totals(K.data(), V.data(), dummy.data(), dummy.data(), dummy.data(), partials.data(), 0);
    auto bases = nans(causal ? (size_t)heads * nch * mw : (size_t)heads * mw);
    launch(scan_bx, heads, 256, 0, [&] { race_scan(partials.data(), bases.data(), nch, mw, causal ? 0 : 2); });
    auto O = nans(nv), DEN = nans(nt);
    if (tiled_causal)
        launch(nch, heads, 256, sh_causal, [&] {
            race_fwd_tile_causal(Q.data(), K.data(), V.data(), W.data(), bases.data(), O.data(), DEN.data(), n, d, dv,
                                 L, P, beta, chunk);
        });
    else if (tile_pass)
        launch(nch, heads, 256, sh_tile_state, [&] {
            race_fwd_tile(Q.data(), W.data(), bases.data(), O.data(), DEN.data(), n, d, dv, L, P, beta, chunk);
        });
    else
        launch(bx, heads, threads, shb, [&] {
            race_fwd(Q.data(), K.data(), V.data(), W.data(), bases.data(), O.data(), DEN.data(), n, d, dv, L, P, beta,
                     chunk, causal);
        });
    // Backward.
    auto DQ = nans(nd), DBQ = nans(nt);
    // The tiled queries' passes also write the chunk totals of Σ φ(q) ĝ / L (partials1).
    auto partials1 = nans((size_t)heads * nch * mw);
    if (tiled_causal)
        launch(nch, heads, 256, sh_causal_query, [&] {
            race_bwd_q_tile_causal(Q.data(), K.data(), V.data(), W.data(), bases.data(), O.data(), G.data(), DEN.data(),
                                   DQ.data(), DBQ.data(), partials1.data(), n, d, dv, L, P, beta, chunk);
        });
    else if (tile_pass)
        launch(nch, heads, 256, sh_tile_query, [&] {
            race_bwd_q_tile(Q.data(), W.data(), bases.data(), O.data(), G.data(), DEN.data(), DQ.data(), DBQ.data(),
                            partials1.data(), n, d, dv, L, P, beta, chunk);
        });
    else
        launch(bx, heads, threads, shb, [&] {
            race_bwd_q(Q.data(), K.data(), V.data(), W.data(), bases.data(), O.data(), G.data(), DEN.data(), DQ.data(),
                       DBQ.data(), n, d, dv, L, P, beta, chunk, causal);
        });
    if (!tiled_causal && !tile_pass) totals(Q.data(), Q.data(), G.data(), O.data(), DEN.data(), partials1.data(), 1);
    auto dbases = nans(causal ? (size_t)heads * nch * mw : (size_t)heads * mw);
    launch(scan_bx, heads, 256, 0, [&] { race_scan(partials1.data(), dbases.data(), nch, mw, causal ? 1 : 2); });
    auto DK = nans(nd), DV = nans(nv), DBK = nans(nt);
    if (tiled_causal)
        launch(nch, heads, 256, sh_causal, [&] {
            race_bwd_k_tile_causal(Q.data(), K.data(), V.data(), W.data(), dbases.data(), O.data(), G.data(),
                                   DEN.data(), DK.data(), DV.data(), DBK.data(), n, d, dv, L, P, beta, chunk);
        });
    else if (tile_pass)
        launch(nch, heads, 256, sh_tile_state, [&] {
            race_bwd_k_tile(K.data(), V.data(), W.data(), dbases.data(), DK.data(), DV.data(), DBK.data(), n, d, dv, L,
                            P, beta, chunk);
        });
    else
        launch(bx, heads, threads, shb, [&] {
            race_bwd_k(Q.data(), K.data(), V.data(), W.data(), dbases.data(), O.data(), G.data(), DEN.data(), DK.data(),
                       DV.data(), DBK.data(), n, d, dv, L, P, beta, chunk, causal);
        });
    const size_t nb = causal ? (size_t)heads * nch * mw : (size_t)heads * mw;
    CHECK_GUARD(partials, (size_t)heads * nch * mw);
    CHECK_GUARD(partials1, (size_t)heads * nch * mw);
    CHECK_GUARD(bases, nb);
    CHECK_GUARD(dbases, nb);
    CHECK_GUARD(O, nv);
    CHECK_GUARD(DEN, nt);
    CHECK_GUARD(DQ, nd);
    CHECK_GUARD(DK, nd);
    CHECK_GUARD(DV, nv);
    CHECK_GUARD(DBQ, nt);
    CHECK_GUARD(DBK, nt);
    double dbeta = 0.0;
    for (size_t i = 0; i < nt; ++i) dbeta += DBQ[i];
    for (size_t i = 0; i < nt; ++i) dbeta += DBK[i];

    FILE* o = std::fopen(argv[2], "wb");
    if (!o) return 2;
    std::fwrite(O.data(), 4, nv, o);
    std::fwrite(DEN.data(), 4, nt, o);
    std::fwrite(DQ.data(), 4, nd, o);
    std::fwrite(DK.data(), 4, nd, o);
    std::fwrite(DV.data(), 4, nv, o);
    std::fwrite(&dbeta, 8, 1, o);
    std::fclose(o);
    return 0;
}
