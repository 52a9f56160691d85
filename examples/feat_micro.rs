use racelab::cpu::blocked::{Block, T};
use racelab::cpu::{detected_isa, PlanesF32, SoftMap};
use racelab::hashing::Planes;
use std::time::Instant;
fn main() {
    let d = 128;
    let x: Vec<f32> = (0..T * d).map(|i| ((i * 7 % 13) as f32) * 0.05 - 0.3).collect();
    for (p, l) in [(2, 2), (3, 3), (4, 4)] {
        let planes = PlanesF32::from_planes(&Planes::gaussian(l, p, d, 0).unwrap());
        let map = SoftMap { planes: &planes, beta: 8.0 };
        let mut b = Block::new(&map, detected_isa());
        let reps = 20000;
        let t = Instant::now();
        for _ in 0..reps { b.features(&map, &x, T); }
        let s = t.elapsed().as_secs_f64();
        println!("({p},{l}) features: {:.0} cycles/token @4GHz", s * 4e9 / (reps * T) as f64);
    }
}
