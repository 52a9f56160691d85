use racelab::cpu::simd::{dispatch, exp_f32, tanh_f32, detected_isa, Simd, WithSimd};
use std::time::Instant;
struct Bp<'a> { z: &'a mut [f32], on: &'a mut [f32], off: &'a mut [f32], beta: f32 }
impl WithSimd for Bp<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        for ((z, on), off) in self.z.iter_mut().zip(self.on.iter_mut()).zip(self.off.iter_mut()) {
            let u = tanh_f32(*z);
            let t = 2.0 * self.beta * u;
            *z = u;
            let e = exp_f32(-t.abs());
            let inv = 1.0 / (1.0 + e);
            let (big, small) = (inv, e * inv);
            let pos = t >= 0.0;
            *on = if pos { big } else { small };
            *off = if pos { small } else { big };
        }
    }
}
fn main() {
    let n = 1024;
    let src: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32) * 4.0 - 2.0).collect();
    let (mut z, mut on, mut off) = (src.clone(), vec![0.0; n], vec![0.0; n]);
    let reps = 100000;
    let t = Instant::now();
    for _ in 0..reps {
        z.copy_from_slice(&src);
        dispatch(detected_isa(), Bp { z: &mut z, on: &mut on, off: &mut off, beta: 8.0 });
    }
    println!("bitprobs: {:.2} cycles/element @4GHz", t.elapsed().as_secs_f64() * 4e9 / (reps * n) as f64);
    dot_bench();
}
struct DotT<'a> { g: &'a [f32], o: &'a [f32], s: &'a mut [f32] }
impl WithSimd for DotT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self) {
        for (i, si) in self.s.iter_mut().enumerate() {
            *si = S::dot(&self.g[i * 128..(i + 1) * 128], &self.o[i * 128..(i + 1) * 128]);
        }
    }
}
#[allow(dead_code)]
pub fn dot_bench() {
    let rows = 32;
    let g: Vec<f32> = (0..rows * 128).map(|i| (i % 7) as f32 * 0.1).collect();
    let o: Vec<f32> = (0..rows * 128).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut s = vec![0.0f32; rows];
    let reps = 200000;
    let t = Instant::now();
    for _ in 0..reps { dispatch(detected_isa(), DotT { g: &g, o: &o, s: &mut s }); }
    println!("dot128: {:.1} cycles/row @4GHz ({})", t.elapsed().as_secs_f64() * 4e9 / (reps * rows) as f64, s[3]);
}
