//! A spinning team for the decode step's small parallel ops.
//!
//! A decoded token of a small model is a chain of products of a few hundred kilobytes
//! each, a few microseconds of work apiece. Handing half of one to a second thread
//! through `rayon::join` costs about a microsecond while the other worker is awake, and
//! several once it has gone to sleep after tens of microseconds without work: as much as
//! the half it saves. Here the other workers of the pool, once started, spin on one shared word
//! between ops (as OpenMP's threads do between parallel regions), so a part reaches them
//! in the time a cache line takes to cross cores.
//!
//! [`for_each`] runs `f(0..parts)`, each part once, on the calling thread and the
//! helpers. Parts are claimed one at a time from the shared word, so a helper that is
//! late, descheduled or gone leaves its parts to the others and the caller: the caller
//! never waits for a helper that has not claimed a part, and a helper only touches `f`
//! after claiming a part of the current job (which the caller waits for).
//!
//! **The word.** `gen << 32 | tasks << 16 | next`: a job's generation, its task count
//! (the parts cut into up to [`TASKS_PER_THREAD`] contiguous runs per thread, shorter
//! toward the end of a job of many parts) and the
//! next unclaimed task. A claim is a compare-and-swap of the whole word from `next` to
//! `next + 1`; a stale claimer (of an earlier generation) fails it. The job's closure
//! is published (`JOB`) before the word that announces it; the caller resets the count
//! of finished parts before announcing, and returns only when every part is finished, so
//! a claimed part's closure is alive while it runs.
//!
//! **Helpers** are rayon jobs (`rayon::spawn`) that spin until no part has come for
//! [`IDLE`] and then return their thread to the pool. While one spins, its worker takes
//! no other rayon work: rayon calls made meanwhile run with fewer threads (at most
//! [`IDLE`] after the last team job). One caller at a time uses the team; a second,
//! concurrent one (another thread decoding) falls back to rayon, as do calls from outside
//! a rayon pool, pools of one thread and jobs of more than [`MAX_PARTS`] parts.
//!
//! Which thread runs which part changes nothing in the results: every part is computed
//! the same way wherever it runs.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long a helper spins without a part before it returns to the pool. Between two
/// tokens of a small model's decode there are a few tens of microseconds; a user's
/// program that decodes, then does something else, loses a core for at most this long.
const IDLE: Duration = Duration::from_micros(300);
/// The most parts of one job.
pub(crate) const MAX_PARTS: usize = 1 << 24;
/// Contiguous runs of parts a job is cut into, per thread (the claims are of runs).
const TASKS_PER_THREAD: usize = 4;

/// The job being run: a `&(dyn Fn(usize) + Sync)` behind a thin pointer.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

static WORD: AtomicU64 = AtomicU64::new(0);
static JOB: AtomicPtr<Job<'static>> = AtomicPtr::new(std::ptr::null_mut());
static FINISHED: AtomicUsize = AtomicUsize::new(0);
/// Set while a caller runs a job (one caller at a time).
static BUSY: AtomicBool = AtomicBool::new(false);
/// Helpers spinning or spawned and not yet returned.
static HELPERS: AtomicUsize = AtomicUsize::new(0);

fn unpack(w: u64) -> (u64, usize, usize) {
    (
        w >> 32,
        ((w >> 16) & 0xFFFF) as usize,
        (w & 0xFFFF) as usize,
    )
}

/// Claims the next part of the job announced by `w`'s generation, if one is left:
/// `Some(part)`, or `None` once the job's parts are all claimed or a newer job has been
/// announced.
fn claim(gen: u64) -> Option<usize> {
    let mut w = WORD.load(Ordering::Acquire);
    loop {
        let (g, parts, next) = unpack(w);
        if g != gen || next >= parts {
            return None;
        }
        match WORD.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(next),
            Err(now) => w = now,
        }
    }
}

/// Runs the claimed `part` of the current job and counts it finished.
///
/// # Safety
/// `part` must have been claimed (by [`claim`]) for the current job, whose caller is
/// then still waiting for it, so `JOB` points at its live closure.
unsafe fn run_part(part: usize) {
    // SAFETY: the caller published JOB before announcing the generation this part was
    // claimed from (the claim's acquire saw that announcement) and does not return, nor
    // replace JOB, before this part is counted finished.
    let job = unsafe { &*JOB.load(Ordering::Acquire) };
    (job.f)(part);
    FINISHED.fetch_add(1, Ordering::Release);
}

/// A helper: claims and runs parts as jobs come, until none has come for [`IDLE`].
fn helper() {
    let mut seen = unpack(WORD.load(Ordering::Acquire)).0;
    let mut last_work = Instant::now();
    let mut spins = 0u32;
    loop {
        let gen = unpack(WORD.load(Ordering::Acquire)).0;
        if gen != seen {
            while let Some(part) = claim(gen) {
                // SAFETY: claimed for the current job.
                unsafe { run_part(part) };
            }
            seen = gen;
            last_work = Instant::now();
            continue;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && last_work.elapsed() > IDLE {
            break;
        }
    }
    HELPERS.fetch_sub(1, Ordering::AcqRel);
}

/// Starts helpers until the pool's other workers are all helping (or spawned to).
fn start_helpers() {
    let want = rayon::current_num_threads().saturating_sub(1);
    let mut have = HELPERS.load(Ordering::Acquire);
    while have < want {
        match HELPERS.compare_exchange_weak(have, have + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let caller = rayon::current_thread_index();
                rayon::spawn(move || {
                    // A helper picked up by the caller's own thread (which pops its own
                    // queue inside a later rayon call) would spin on jobs only that
                    // thread posts: leave at once.
                    if rayon::current_thread_index() == caller {
                        HELPERS.fetch_sub(1, Ordering::AcqRel);
                    } else {
                        helper();
                    }
                });
                have += 1;
            }
            Err(now) => have = now,
        }
    }
}

/// Runs `f(part)` for every `part < parts`, each once, on this thread and the team's
/// spinning helpers (or on rayon where the team does not apply; see the module docs).
/// Returns when all parts are done.
pub(crate) fn for_each(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    if parts == 0 {
        return;
    }
    let usable = parts > 1
        && parts <= MAX_PARTS
        && rayon::current_thread_index().is_some()
        && (2..=(1 << 12)).contains(&rayon::current_num_threads());
    if !usable
        || BUSY
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        (0..parts).into_par_iter().for_each(f);
        return;
    }
    // Parts are claimed in up to TASKS_PER_THREAD contiguous runs per thread: a claim is
    // a compare-and-swap on a line every thread reads, too dear to pay per part when a
    // job has hundreds (the output layer's 266 bands).
    let threads = rayon::current_num_threads();
    let tasks = parts.min(TASKS_PER_THREAD * threads);
    // With many parts (the output layer's bands), task t starts at
    // parts·(1 - (1 - t/tasks)²): runs that shrink toward the end, so the thread that
    // finishes first takes the small last ones and neither waits long.
    let shrink = parts >= 4 * tasks;
    let start = |t: usize| {
        if shrink {
            let left = tasks - t;
            parts - parts * left * left / (tasks * tasks)
        } else {
            t * parts / tasks
        }
    };
    let run = |t: usize| {
        for part in start(t)..start(t + 1) {
            f(part);
        }
    };
    let job = Job { f: &run };
    // SAFETY (lifetime): JOB is dereferenced only for claimed parts of this job, and this
    // function returns only after all of them are finished (see `run_part`).
    JOB.store(
        (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>(),
        Ordering::Release,
    );
    FINISHED.store(0, Ordering::Relaxed);
    let gen = (unpack(WORD.load(Ordering::Relaxed)).0 + 1) & 0xFFFF_FFFF;
    WORD.store(gen << 32 | (tasks as u64) << 16, Ordering::Release);
    start_helpers();
    while let Some(task) = claim(gen) {
        // SAFETY: claimed for this job, which is current.
        unsafe { run_part(task) };
    }
    while FINISHED.load(Ordering::Acquire) < tasks {
        std::hint::spin_loop();
    }
    BUSY.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Every part runs exactly once, on pools of one to four threads, over many jobs in a
    /// row (helpers awake) and after pauses longer than [`IDLE`] (helpers gone and
    /// restarted), including jobs of one part and of more parts than threads.
    #[test]
    fn every_part_runs_once() {
        for threads in 1..=4 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| {
                for round in 0..300usize {
                    // Up to 37 parts, and every tenth job hundreds (the shrinking runs).
                    let parts = if round % 10 == 3 {
                        200 + round
                    } else {
                        1 + round % 37
                    };
                    let counts: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
                    for_each(parts, &|p| {
                        counts[p].fetch_add(1, Ordering::Relaxed);
                    });
                    for (p, c) in counts.iter().enumerate() {
                        assert_eq!(
                            c.load(Ordering::Relaxed),
                            1,
                            "{threads} threads, round {round}: part {p} of {parts}"
                        );
                    }
                    if round % 100 == 99 {
                        std::thread::sleep(IDLE * 3);
                    }
                }
            });
        }
    }

    /// Two threads using the team at once (one of them falls back to rayon) still run
    /// every part of their jobs once.
    #[test]
    fn concurrent_callers_each_get_their_parts() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        // 200 jobs of `parts` parts, each part counted once.
        let jobs = |parts: usize| {
            for _ in 0..200 {
                let counts: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
                for_each(parts, &|p| {
                    counts[p].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        };
        pool.install(|| rayon::join(|| jobs(9), || jobs(5)));
    }
}
