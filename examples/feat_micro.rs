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
        let mp = (l << p).next_multiple_of(16);
        let gphi: Vec<f32> = (0..T * mp).map(|i| ((i * 3 % 11) as f32) * 0.1 - 0.5).collect();
        let t = Instant::now();
        let mut acc = 0.0;
        for _ in 0..reps { acc += b.backward(&map, &gphi, mp, T); }
        let s = t.elapsed().as_secs_f64();
        println!("({p},{l}) backward: {:.0} cycles/token @4GHz ({acc:.1})", s * 4e9 / (reps * T) as f64);
    }
}
