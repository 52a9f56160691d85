//! CUDA backend: the error path and NVRTC sources are checked everywhere; the kernels are
//! compared with the CPU kernels on identical inputs and planes only where a device exists
//! (`cfg(racelab_cuda_tests)`, set by build.rs). Without one those tests are *ignored* with
//! "skipped: no CUDA device" — never counted as passed.
use racelab::backend::SoftGrads;
use racelab::backend::{Backend, Forward, Heads, PlanesF32};
use racelab::cpu::CpuRace;
use racelab::cuda::{self, from_bf16, to_bf16, GpuInput, GpuShape, KERNELS, RACE_CU};
use racelab::params::{Beta, Bits, Seed, Tables};
use racelab::rng::SeededRng;
use racelab::shared::SoftMap;
use racelab::{Planes, RaceError};

/// The production CPU kernels through the backend contract: forward and backward, at the
/// detected ISA, on `[q, k, v, g]`.
fn cpu_kernels(
    planes: &PlanesF32,
    beta: f32,
    causal: bool,
    [q, k, v, g]: [Heads; 4],
) -> (Forward, SoftGrads) {
    let params = racelab::RaceParams::new(Bits(planes.p()), Tables(planes.l()), Beta(beta as f64))
        .unwrap()
        .with_causal(causal);
    CpuRace::detected()
        .forward_backward(&params, planes, q, k, v, g)
        .unwrap()
}

/// Planes, inputs and a shape of one head, two tokens, d = dv = 4.
fn tiny_problem() -> (PlanesF32, Vec<f32>, GpuShape) {
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(2), Tables(2), 4, Seed(1)).unwrap());
    let s = GpuShape {
        heads: 1,
        n: 2,
        d: 4,
        dv: 4,
    };
    (planes, vec![0.5f32; 8], s)
}

#[test]
fn no_device_is_a_clear_error_not_a_panic() {
    match cuda::ensure_device() {
        Ok(()) => println!("a CUDA device is present; the error path is not exercised here"),
        Err(e) => {
            assert!(matches!(e, RaceError::NoCuda(_)), "{e:?}");
            assert!(e.to_string().starts_with("no CUDA device: "), "{e}");
            println!("skipped: no CUDA device ({e})");
        }
    }
    // The public entry points return the same error rather than panicking.
    let (planes, x, s) = tiny_problem();
    if cuda::ensure_device().is_err() {
        let e = cuda::soft_forward(
            &planes,
            2.0,
            GpuInput::F32(&x),
            GpuInput::F32(&x),
            GpuInput::F32(&x),
            s,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("no CUDA device"), "{e}");
    }
    // Bad shapes are caught before the device is touched.
    let e = cuda::soft_forward(
        &planes,
        2.0,
        GpuInput::F32(&x[..7]),
        GpuInput::F32(&x),
        GpuInput::F32(&x),
        s,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("`q`"), "{e}");
    let e = cuda::soft_forward(
        &planes,
        -1.0,
        GpuInput::F32(&x),
        GpuInput::F32(&x),
        GpuInput::F32(&x),
        s,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("`beta`"), "{e}");
    // Non-finite inputs, f32 and bf16, are named before the device is touched.
    let non_finite = |q: GpuInput, k: GpuInput, v: GpuInput, arg: &str, at: usize| {
        let e = cuda::soft_forward(&planes, 2.0, q, k, v, s, false).unwrap_err();
        assert!(
            matches!(&e, RaceError::NonFinite { arg: a, index, .. } if a == arg && *index == at),
            "{e}"
        );
    };
    let mut bad = x.clone();
    bad[3] = f32::NAN;
    non_finite(
        GpuInput::F32(&x),
        GpuInput::F32(&bad),
        GpuInput::F32(&x),
        "k",
        3,
    );
    let (xb, mut badb) = (to_bf16(&x), to_bf16(&x));
    badb[5] = to_bf16(&[f32::INFINITY])[0];
    non_finite(
        GpuInput::Bf16(&xb),
        GpuInput::Bf16(&xb),
        GpuInput::Bf16(&badb),
        "v",
        5,
    );
}

#[test]
fn nvrtc_source_defines_every_launched_kernel() {
    for (name, value) in [
        ("TILE", cuda::TILE),
        ("TM", cuda::TILE_TM),
        ("TC", cuda::TILE_TC),
    ] {
        assert!(
            RACE_CU.contains(&format!("#define {name} {value}\n")),
            "race.cu's {name} differs from the Rust side's {value}"
        );
    }
    for k in KERNELS {
        assert!(
            RACE_CU
                .lines()
                .any(|line| line.starts_with("extern \"C\" __global__ void ")
                    && line.contains(&format!(" {k}("))),
            "race.cu lacks kernel {k}"
        );
    }
    assert!(
        !RACE_CU.contains("atomicAdd"),
        "kernels must not use float atomics (determinism)"
    );
}

#[test]
fn bf16_round_trip_is_exact_on_representable_values() {
    let x = [1.0f32, -2.5, 0.15625, 2f32.powi(100), -0.0];
    assert_eq!(from_bf16(&to_bf16(&x)), x.to_vec());
    let y = from_bf16(&to_bf16(&[1.0 + 1.0 / 256.0]));
    assert!(y[0] == 1.0 || y[0] == 1.0 + 1.0 / 128.0);
}

fn data(len: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut rng = SeededRng::new(seed, 5);
    (0..len).map(|_| (rng.normal() * scale) as f32).collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max).max(1e-30) as f64;
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
        / scale
}

/// Compile race.cu with the CPU emulation of the CUDA execution model
/// (`tests/cuda_emu/runtime.hpp`) and the launch sequence of `crates/racelab-core/src/cuda/device.rs`
/// (`tests/cuda_emu/driver.cpp`), once per input dtype.
fn emulator(bf16: bool) -> std::path::PathBuf {
    use std::sync::OnceLock;
    static BIN: [OnceLock<std::path::PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    BIN[bf16 as usize]
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("racelab-emu-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let src = dir.join(format!("emu{}.cpp", bf16 as u8));
            let root = env!("CARGO_MANIFEST_DIR");
            let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
            let kernels = RACE_CU.replace("extern __shared__ float sh[];", "#define sh g_shared");
            std::fs::write(
                &src,
                format!(
                    "{}\n{kernels}\n{}",
                    read("tests/cuda_emu/runtime.hpp"),
                    read("tests/cuda_emu/driver.cpp")
                ),
            )
            .unwrap();
            let bin = dir.join(format!("emu{}", bf16 as u8));
            let mut cmd = std::process::Command::new("g++");
            cmd.args(["-std=c++17", "-O1", "-w", "-o"])
                .arg(&bin)
                .arg(&src);
            if bf16 {
                cmd.arg("-DRACE_BF16");
            }
            // The tuning macros of race.cu (e.g. RACELAB_EMU_DEFINES="-DPROD_SPREAD=64"), so a
            // variant meant for a GPU run is checked here first.
            if let Ok(extra) = std::env::var("RACELAB_EMU_DEFINES") {
                cmd.args(extra.split_whitespace());
            }
            let o = cmd
                .output()
                .expect("g++ is needed to build the CUDA emulator");
            assert!(
                o.status.success(),
                "race.cu does not build under the CPU emulation:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            bin
        })
        .clone()
}

/// Run forward+backward of race.cu under the CPU emulation. q, k, v are f32 or bf16 words;
/// `[causal, tiled, reverse]`: Algorithm 2, the tiled kernel path, the blocks in reverse order.
fn emulate(
    planes: &PlanesF32,
    beta: f32,
    [q, k, v]: [GpuInput; 3],
    g: &[f32],
    s: GpuShape,
    [causal, tiled, reverse]: [bool; 3],
) -> (Vec<f32>, Vec<f32>, racelab::backend::SoftGrads) {
    let path = if tiled {
        cuda::KernelPath::Tiled
    } else {
        cuda::KernelPath::Warp
    };
    // Chunks of 64 tokens: several chunks, and several tiles within a chunk, at these sizes.
    let geo = cuda::geometry_with(planes.p(), planes.l(), s, path)
        .unwrap()
        .with_chunk(s.n, 64);
    let bf16 = matches!(q, GpuInput::Bf16(_));
    let mut buf: Vec<u8> = Vec::new();
    for x in [
        s.heads,
        s.n,
        s.d,
        s.dv,
        planes.l(),
        planes.p(),
        causal as usize,
        geo.warps,
        geo.chunk,
        bf16 as usize,
        geo.shared_private,
        geo.shared_block,
        geo.tiled as usize,
        geo.shared_tile,
        geo.shared_tile_state,
        geo.tiled_causal as usize,
        geo.shared_tile_causal,
        geo.shared_tile_query,
        geo.shared_tile_causal_query,
    ] {
        buf.extend((x as i32).to_le_bytes());
    }
    buf.extend(beta.to_le_bytes());
    buf.extend(planes.w().iter().flat_map(|x| x.to_le_bytes()));
    for x in [q, k, v] {
        match x {
            GpuInput::F32(a) => buf.extend(a.iter().flat_map(|x| x.to_le_bytes())),
            GpuInput::Bf16(a) => buf.extend(a.iter().flat_map(|x| x.to_le_bytes())),
        }
    }
    buf.extend(g.iter().flat_map(|x| x.to_le_bytes()));
    let bin = emulator(bf16);
    let dir = bin.parent().unwrap();
    let tag = format!(
        "{}-{}-{}-{}",
        planes.p(),
        planes.l(),
        s.n,
        causal as u8 + 2 * bf16 as u8 + 4 * geo.tiled as u8 + 8 * reverse as u8
    );
    let (inp, out) = (
        dir.join(format!("in-{tag}")),
        dir.join(format!("out-{tag}")),
    );
    std::fs::write(&inp, &buf).unwrap();
    let mut cmd = std::process::Command::new(&bin);
    if reverse {
        cmd.env("EMU_REVERSE", "1");
    }
    let run = cmd.arg(&inp).arg(&out).output().unwrap();
    assert!(
        run.status.success(),
        "emulated run failed ({}): {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let raw = std::fs::read(&out).unwrap();
    let mut at = 0;
    let mut take = |len: usize| -> Vec<f32> {
        let v = raw[at..at + 4 * len]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        at += 4 * len;
        v
    };
    let (nd, nv, nt) = (s.heads * s.n * s.d, s.heads * s.n * s.dv, s.heads * s.n);
    let o = take(nv);
    let den = take(nt);
    let (dq, dk, dvv) = (take(nd), take(nd), take(nv));
    let dbeta = f64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
    (
        o,
        den,
        racelab::backend::SoftGrads {
            dq,
            dk,
            dv: dvv,
            dbeta,
        },
    )
}

/// One test body for every device: run soft RACE forward+backward on `device` and compare
/// with the CPU kernels (for "cpu" this is the kernel against itself on a second run:
/// determinism; "emu" is race.cu under the CPU emulation, at smaller sizes, with the tiled
/// kernels wherever their tiles fit; "emu-warp" the same on the warp-per-chunk kernels).
fn check_device(device: &str) {
    let cases: &[(usize, usize, f32, usize, usize, usize, usize)] = if device.starts_with("emu") {
        &[
            (2, 2, 4.0, 16, 8, 150, 2),
            (4, 4, 8.0, 40, 33, 70, 1),
            (3, 2, 1.0, 8, 1, 1, 1),
            // m = 12 and 24 features: column groups of the gradient product that do not
            // fill the warp.
            (2, 3, 2.0, 20, 5, 90, 1),
            (3, 3, 16.0, 12, 6, 40, 1),
            // dv + 1 > 160: bank columns beyond one register block per lane.
            (2, 2, 2.0, 8, 170, 40, 1),
        ]
    } else {
        &[
            (2, 2, 4.0, 16, 8, 600, 2),
            (4, 4, 8.0, 32, 16, 300, 1),
            (3, 2, 1.0, 8, 1, 1, 1),
            (2, 3, 2.0, 20, 5, 900, 1),
            (3, 3, 16.0, 12, 6, 400, 3),
            (2, 2, 2.0, 8, 170, 400, 1),
            (2, 2, 8.0, 128, 128, 5000, 2),
        ]
    };
    for &(p, l, beta, d, dv, n, heads) in cases {
        let planes =
            PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(3)).unwrap());
        let (q, k, v, g) = (
            data(heads * n * d, 1, 0.5),
            data(heads * n * d, 2, 0.5),
            data(heads * n * dv, 3, 1.0),
            data(heads * n * dv, 4, 1.0),
        );
        for causal in [false, true] {
            let (qh, kh, vh) = (
                Heads::new(heads, n, d, &q).unwrap(),
                Heads::new(heads, n, d, &k).unwrap(),
                Heads::new(heads, n, dv, &v).unwrap(),
            );
            let gh = Heads::new(heads, n, dv, &g).unwrap();
            let (cpu, cg) = cpu_kernels(&planes, beta, causal, [qh, kh, vh, gh]);
            let s = GpuShape { heads, n, d, dv };
            // bf16 inputs: a device's forward against the CPU on the same (bf16-rounded) values.
            let (qb, kb, vb) = (to_bf16(&q), to_bf16(&k), to_bf16(&v));
            let check_bf16 = |ob: &[f32]| {
                let (qw, kw, vw) = (from_bf16(&qb), from_bf16(&kb), from_bf16(&vb));
                let (cb, _) = cpu_kernels(
                    &planes,
                    beta,
                    causal,
                    [
                        Heads::new(heads, n, d, &qw).unwrap(),
                        Heads::new(heads, n, d, &kw).unwrap(),
                        Heads::new(heads, n, dv, &vw).unwrap(),
                        gh,
                    ],
                );
                let err = rel(ob, &cb.o);
                assert!(
                    err <= 1e-5,
                    "{device} bf16 forward P={p} L={l} causal={causal}: {err:.2e}"
                );
            };
            let (o, gr) = match device {
                "emu" | "emu-warp" => {
                    let tiled = device == "emu";
                    let run = |q: GpuInput, k: GpuInput, v: GpuInput, reverse: bool| {
                        let (o, _, gr) =
                            emulate(&planes, beta, [q, k, v], &g, s, [causal, tiled, reverse]);
                        (o, gr)
                    };
                    let f32_in = (GpuInput::F32(&q), GpuInput::F32(&k), GpuInput::F32(&v));
                    let (o, gr) = run(f32_in.0, f32_in.1, f32_in.2, false);
                    // The same threads run in reverse order must give the same bits: any
                    // difference is a missing barrier.
                    let (o_rev, gr_rev) = run(f32_in.0, f32_in.1, f32_in.2, true);
                    assert!(
                        o_rev == o && gr_rev.dq == gr.dq && gr_rev.dk == gr.dk && gr_rev.dv == gr.dv,
                        "emulated {device} P={p} L={l} causal={causal}: results depend on the thread order (a missing barrier)"
                    );
                    let (ob, _) = run(
                        GpuInput::Bf16(&qb),
                        GpuInput::Bf16(&kb),
                        GpuInput::Bf16(&vb),
                        false,
                    );
                    check_bf16(&ob);
                    (o, gr)
                }
                "cuda" => {
                    let (f, gr) = cuda::soft_backward(
                        &planes,
                        beta,
                        GpuInput::F32(&q),
                        GpuInput::F32(&k),
                        GpuInput::F32(&v),
                        &g,
                        s,
                        causal,
                    )
                    .expect("CUDA run");
                    let (f2, gr2) = cuda::soft_backward(
                        &planes,
                        beta,
                        GpuInput::F32(&q),
                        GpuInput::F32(&k),
                        GpuInput::F32(&v),
                        &g,
                        s,
                        causal,
                    )
                    .expect("CUDA run");
                    assert_eq!(f.o, f2.o, "CUDA forward is not deterministic");
                    assert_eq!(gr.dq, gr2.dq, "CUDA backward is not deterministic");
                    let fb = cuda::soft_forward(
                        &planes,
                        beta,
                        GpuInput::Bf16(&qb),
                        GpuInput::Bf16(&kb),
                        GpuInput::Bf16(&vb),
                        s,
                        causal,
                    )
                    .expect("CUDA bf16 run");
                    check_bf16(&fb.o);
                    (f.o, gr)
                }
                _ => {
                    let (again, g2) = cpu_kernels(&planes, beta, causal, [qh, kh, vh, gh]);
                    (again.o, g2)
                }
            };
            let tag = format!("{device} P={p} L={l} n={n} causal={causal}");
            assert!(
                o.iter().all(|x| x.is_finite()),
                "forward {tag}: non-finite output (an element no kernel wrote?)"
            );
            assert!(
                rel(&o, &cpu.o) <= 1e-5,
                "forward {tag}: {:.2e}",
                rel(&o, &cpu.o)
            );
            let mut report = format!("{tag}: forward {:.1e}", rel(&o, &cpu.o));
            for (name, a, b) in [
                ("dq", &gr.dq, &cg.dq),
                ("dk", &gr.dk, &cg.dk),
                ("dv", &gr.dv, &cg.dv),
            ] {
                let floor = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max).max(1e-3);
                let err = a
                    .iter()
                    .zip(b.iter())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max)
                    / floor;
                assert!(
                    a.iter().all(|x| x.is_finite()),
                    "{name} {tag}: non-finite gradient"
                );
                assert!(err <= 1e-4, "{name} {tag}: {err:.2e}");
                report += &format!(", {name} {err:.1e}");
            }
            println!(
                "{report}, dbeta {:.1e}",
                (gr.dbeta - cg.dbeta).abs() / cg.dbeta.abs().max(1.0)
            );
            assert!(
                (gr.dbeta - cg.dbeta).abs() <= 1e-3 * cg.dbeta.abs().max(1.0),
                "dbeta {tag}: {} vs {}",
                gr.dbeta,
                cg.dbeta
            );
        }
    }
}

#[test]
fn soft_race_on_cpu_device() {
    check_device("cpu");
}

/// race.cu itself, on every machine: its kernels run under a CPU emulation of the CUDA
/// execution model (threads as fibers, barriers, warp shuffles, NaN-poisoned shared memory
/// and outputs) and must match the CPU kernels like a real device.
#[test]
fn soft_race_on_emulated_cuda() {
    check_device("emu");
}

/// The same on the warp-per-chunk kernels for every pass (what causal passes, few features
/// and shapes beyond the tiles' register blocks use).
#[test]
fn soft_race_on_emulated_cuda_warp_path() {
    check_device("emu-warp");
}

#[test]
#[cfg_attr(not(racelab_cuda_tests), ignore = "skipped: no CUDA device")]
fn soft_race_on_cuda_device() {
    cuda::ensure_device().expect("racelab_cuda_tests is set but no CUDA device opened");
    check_device("cuda");
}

/// race.cu at large beta, under the emulation, with the host's part of the CUDA backend
/// (`cuda::finish_forward`, `cuda::finish_backward`): the bundled MiniLM layer 5 (raw Q/K),
/// P = 3, L = 4, causal and not, on the kernels `cuda::path_for` picks. The rows the kernels
/// flag (saved `DEN = 0`) are recomputed on the host; every row must match the CPU kernels
/// (which `crates/racelab-core/src/cpu/tests/large_beta.rs` holds to the exact reference) within 1e-5 forward and 1e-4
/// in the gradients.
#[test]
fn large_beta_on_emulated_cuda() {
    let dir = racelab::experiments::real::bundled().expect("experiments/data/minilm is committed");
    let load = |name: &str| -> Vec<f32> {
        let a = racelab::io::read_npy(&dir.join(name)).unwrap();
        a.tensor.data.iter().map(|&x| x as f32).collect()
    };
    // Four of the twelve heads (the emulation runs one fiber per thread), 256 tokens, d = 32.
    let (heads, n, d) = (4usize, 256usize, 32usize);
    let (q, k, v) = (
        load("q_5.npy")[..heads * n * d].to_vec(),
        load("k_5.npy")[..heads * n * d].to_vec(),
        load("v_5.npy")[..heads * n * d].to_vec(),
    );
    let g = data(heads * n * d, 6, 1.0);
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(3), Tables(4), d, Seed(0)).unwrap());
    let s = GpuShape { heads, n, d, dv: d };
    // At beta = 10^4 every bit of these heads is saturated: the largest dq is 1e-3, where
    // `Σ_r φ_r (gφ_r − ḡ)` would keep only rounding; the kernels' bit contrasts keep it.
    for beta in [100.0f32, 1000.0, 1e4] {
        for causal in [false, true] {
            let tiled = cuda::path_for(beta).is_none();
            let (o, den, mut gr) = emulate(
                &planes,
                beta,
                [GpuInput::F32(&q), GpuInput::F32(&k), GpuInput::F32(&v)],
                &g,
                s,
                [causal, tiled, false],
            );
            let qkv = [&GpuInput::F32(&q), &GpuInput::F32(&k), &GpuInput::F32(&v)];
            let map = SoftMap::new(&planes, beta).unwrap();
            let f = cuda::finish_forward(o, den, map, qkv, s, causal);
            cuda::finish_backward(&f, map, qkv, &g, s, causal, &mut gr);
            let (qh, kh, vh, gh) = (
                Heads::new(heads, n, d, &q).unwrap(),
                Heads::new(heads, n, d, &k).unwrap(),
                Heads::new(heads, n, d, &v).unwrap(),
                Heads::new(heads, n, d, &g).unwrap(),
            );
            let (cpu, cg) = cpu_kernels(&planes, beta, causal, [qh, kh, vh, gh]);
            let tag = format!("beta={beta} causal={causal}");
            assert_eq!(
                f.recomputed.rows, cpu.recomputed.rows,
                "{tag}: the emulated kernels flag the rows the CPU kernels flag"
            );
            if causal {
                assert!(!f.recomputed.rows.is_empty(), "{tag}: no row flagged");
            }
            let err = rel(&f.o, &cpu.o);
            assert!(err <= 1e-5, "{tag}: forward {err:.2e}");
            let pairs = [
                ("dq", &gr.dq, &cg.dq),
                ("dk", &gr.dk, &cg.dk),
                ("dv", &gr.dv, &cg.dv),
            ];
            let mut worst = 0.0f64;
            for (name, a, b) in pairs {
                let e = rel(a, b);
                assert!(e <= 1e-4, "{tag}: {name} {e:.2e}");
                worst = worst.max(e);
            }
            println!(
                "{tag}: {} rows recomputed, forward {err:.1e}, gradients {worst:.1e}",
                f.recomputed.rows.len()
            );
        }
    }
}

/// race.cu at the top of the value range the one validation accepts, under the emulation:
/// values `v` just inside the bound of `validate` (step 5: `L·n·max|v|` within a quarter of
/// f32's largest) run finite and equal to the CPU kernels (1e-5 forward, 1e-4 gradients), and
/// eight times larger they are refused before any device is asked for, naming `v` and the f64
/// reference, on the CUDA device as on the CPU: the kernels never see values whose sums overflow.
#[test]
fn values_at_the_top_of_the_accepted_range_on_emulated_cuda() {
    let (heads, n, d, dv, p, l, beta) = (2usize, 128usize, 16usize, 8usize, 2, 3, 4.0f32);
    let planes = PlanesF32::from_planes(&Planes::gaussian(Bits(p), Tables(l), d, Seed(3)).unwrap());
    let (q, k) = (data(heads * n * d, 1, 1.0), data(heads * n * d, 2, 1.0));
    let unit = data(heads * n * dv, 3, 1.0);
    let top = unit.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
    // The largest power of two the bound accepts, as a scale of `unit`.
    let limit = f32::MAX as f64 / 4.0 / (l * n) as f64 / top;
    let scale = 2f64.powi(limit.log2().floor() as i32);
    // dv·max|g| ≤ 1: the gradients' own factor of the bound stays 1.
    let g: Vec<f32> = data(heads * n * dv, 4, 1.0)
        .iter()
        .map(|x| x / (4.0 * dv as f32))
        .collect();
    let params = racelab::RaceParams::new(Bits(p), Tables(l), Beta(beta as f64)).unwrap();
    for causal in [false, true] {
        let params = params.with_causal(causal);
        let qh = Heads::new(heads, n, d, &q).unwrap();
        let kh = Heads::new(heads, n, d, &k).unwrap();
        let gh = Heads::new(heads, n, dv, &g).unwrap();
        let over: Vec<f32> = unit
            .iter()
            .map(|x| (*x as f64 * scale * 8.0) as f32)
            .collect();
        let vh = Heads::new(heads, n, dv, &over).unwrap();
        let e = racelab::backend::check(&params, &planes, &qh, &kh, &vh, Some(&gh)).unwrap_err();
        assert_eq!(e.arg(), Some("v"), "{e}");
        assert!(e.to_string().contains("reference"), "{e}");
        let opts = racelab::AttendOptions::new(racelab::Method::soft(
            Bits(p),
            Tables(l),
            Beta(beta as f64),
            Seed(3),
        ))
        .causal(causal);
        let wide = |x: &[f32], c: usize| racelab::Tensor {
            shape: vec![heads, n, c],
            data: x.iter().map(|&a| a as f64).collect(),
        };
        let (qw, kw, vw) = (wide(&q, d), wide(&k, d), wide(&over, dv));
        let e =
            racelab::attend::attend_with(&qw, &kw, &vw, &opts, racelab::Device::Cuda).unwrap_err();
        assert_eq!(
            e.arg(),
            Some("v"),
            "the CUDA device refuses as the CPU does: {e}"
        );

        let v: Vec<f32> = unit.iter().map(|x| (*x as f64 * scale) as f32).collect();
        let vh = Heads::new(heads, n, dv, &v).unwrap();
        racelab::backend::check(&params, &planes, &qh, &kh, &vh, Some(&gh)).unwrap();
        let s = GpuShape { heads, n, d, dv };
        let x = [GpuInput::F32(&q), GpuInput::F32(&k), GpuInput::F32(&v)];
        let (o, den, mut gr) = emulate(
            &planes,
            beta,
            [x[0], x[1], x[2]],
            &g,
            s,
            [causal, false, false],
        );
        let map = SoftMap::new(&planes, beta).unwrap();
        let f = cuda::finish_forward(o, den, map, [&x[0], &x[1], &x[2]], s, causal);
        cuda::finish_backward(&f, map, [&x[0], &x[1], &x[2]], &g, s, causal, &mut gr);
        let (cpu, cg) = cpu_kernels(&planes, beta, causal, [qh, kh, vh, gh]);
        let tag = format!("causal={causal}, max|v| = {:.3e}", top * scale);
        let all = [&f.o, &cpu.o, &gr.dq, &gr.dk, &gr.dv, &cg.dq, &cg.dk, &cg.dv];
        assert!(
            all.iter().all(|a| a.iter().all(|x| x.is_finite())),
            "{tag}: a non-finite value"
        );
        let err = rel(&f.o, &cpu.o);
        assert!(err <= 1e-5, "{tag}: forward {err:.2e}");
        for (name, a, b) in [
            ("dq", &gr.dq, &cg.dq),
            ("dk", &gr.dk, &cg.dk),
            ("dv", &gr.dv, &cg.dv),
        ] {
            let e = rel(a, b);
            assert!(e <= 1e-4, "{tag}: {name} {e:.2e}");
        }
        println!("{tag}: forward {err:.1e}");
    }
}

/// The CUDA kernels' host check holds shapes to their data, with products that cannot wrap
/// (the kernels index every buffer by these extents), before any device is asked for.
#[test]
fn wrapping_shapes_are_refused_before_a_launch() {
    let (planes, x, s) = tiny_problem();
    let inp = || GpuInput::F32(&x);
    assert!(cuda::check_problem(&planes, 2.0, &inp(), &inp(), &inp(), s).is_ok());
    // 2 · 2^63 · 4 wraps to 0 in release arithmetic: empty inputs would have passed.
    let wrap = GpuShape {
        heads: 2,
        n: 1 << 63,
        d: 4,
        dv: 4,
    };
    let empty: Vec<f32> = Vec::new();
    let e = || GpuInput::F32(&empty);
    assert!(cuda::check_problem(&planes, 2.0, &e(), &e(), &e(), wrap).is_err());
}
