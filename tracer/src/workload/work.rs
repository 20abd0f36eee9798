//! The work one request does: a fixed number of steps, calibrated once to last the requested
//! CPU time on a quiet machine. Fixed work, not a fixed time: a request slowed by a cold cache
//! takes longer on the CPU, as a real one would. Steps are arithmetic, or with a working set, a
//! dependent walk through it (each step waits for the load before), so its speed is the
//! speed of the cache level the working set lives in.

use crate::sources::clock::thread_cpu_ns;

const LINE: usize = 64;
const WORDS_PER_LINE: usize = LINE / 8;

pub struct Work {
    steps: u64,
    /// Cache lines in a random cycle: the first word of each line is the index of the next.
    walk: Vec<u64>,
    pos: usize,
    acc: u64,
}

/// A random cyclic order of `lines` cache lines (Sattolo's algorithm, fixed seed): a walk that
/// visits every line once per lap and that the prefetchers cannot predict.
fn random_cycle(lines: usize) -> Vec<u64> {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % i as u64) as usize;
        order.swap(i, j);
    }
    let mut walk = vec![0u64; lines * WORDS_PER_LINE];
    for k in 0..lines {
        walk[order[k] * WORDS_PER_LINE] = (order[(k + 1) % lines] * WORDS_PER_LINE) as u64;
    }
    walk
}

impl Work {
    fn with_steps(steps: u64, working_set: usize) -> Self {
        let lines = working_set / LINE;
        Self {
            steps,
            walk: if lines >= 2 {
                random_cycle(lines)
            } else {
                vec![]
            },
            pos: 0,
            acc: 1,
        }
    }

    fn steps(&mut self, n: u64) {
        if self.walk.is_empty() {
            let mut x = self.acc;
            for _ in 0..n {
                x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5555;
            }
            self.acc = std::hint::black_box(x);
        } else {
            let mut p = self.pos;
            for _ in 0..n {
                p = self.walk[p] as usize;
            }
            self.pos = std::hint::black_box(p);
        }
    }

    /// Measures the step rate with a warm cache and sizes a request to `work_ns` of it. The
    /// probe grows until one try takes at least 1 ms of thread CPU time, and the median of
    /// seven tries is taken: under emulation (QEMU TCG, an unstable TSC) the thread clock has
    /// been seen to read a quarter of the true time on some tries, and the minimum of five
    /// then sized requests so large that the demo server never finished its queue.
    pub fn calibrate(work_ns: u64, working_set: usize) -> Self {
        let mut w = Self::with_steps(0, working_set);
        let mut probe = 50_000u64;
        w.steps(probe); // warm up
        let time = |w: &mut Self, n: u64| {
            let t = thread_cpu_ns();
            w.steps(n);
            thread_cpu_ns().saturating_sub(t).max(1)
        };
        while probe < 1 << 32 && time(&mut w, probe) < 1_000_000 {
            probe *= 2;
        }
        let mut tries: Vec<u64> = (0..7).map(|_| time(&mut w, probe)).collect();
        tries.sort_unstable();
        w.steps = (work_ns as u128 * probe as u128 / tries[3] as u128).max(1) as u64;
        w
    }

    /// The same amount of work on a working set of its own (one per worker thread).
    pub fn fresh(&self) -> Self {
        Self::with_steps(self.steps, self.walk.len() * 8)
    }

    /// Does one request's work.
    pub fn run(&mut self) {
        self.steps(self.steps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_visits_every_line_once_per_lap() {
        let walk = random_cycle(1000);
        let mut seen = vec![false; 1000];
        let mut p = 0usize;
        for _ in 0..1000 {
            assert!(
                !seen[p / WORDS_PER_LINE],
                "line {} visited twice",
                p / WORDS_PER_LINE
            );
            seen[p / WORDS_PER_LINE] = true;
            p = walk[p] as usize;
        }
        assert_eq!(p, 0, "one lap comes back to the start");
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn fresh_work_keeps_the_size() {
        let w = Work::with_steps(123, 64 * 1024);
        let f = w.fresh();
        assert_eq!((f.steps, f.walk.len()), (123, w.walk.len()));
        assert!(Work::with_steps(5, 0).walk.is_empty());
    }
}
