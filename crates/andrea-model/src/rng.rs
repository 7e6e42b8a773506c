//! A small seeded random number generator: SplitMix64 for bits, Box-Muller for normals.
//! Deterministic across platforms and thread counts (it runs on one thread, on the
//! host), which is what makes an initialisation or a sampled sequence reproducible
//! from its seed.

/// SplitMix64 (Steele, Lea and Flood 2014): 64 bits of state, passes BigCrush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The state, to save and restore a generator exactly.
    pub fn state(&self) -> u64 {
        self.state
    }

    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box-Muller; one of the pair is discarded, which keeps
    /// the generator's state the only state).
    pub fn normal(&mut self) -> f64 {
        // 1 - unit() is in (0, 1], so the logarithm is finite.
        let r = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.unit();
        r * theta.cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_zero_mean_and_unit_variance() {
        let mut r = Rng::new(42);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.01, "{var}");
    }

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        let mut c = Rng::from_state(a.state());
        assert_eq!(c.next_u64(), a.next_u64());
    }
}
