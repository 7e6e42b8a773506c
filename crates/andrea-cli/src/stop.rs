//! How a training run is asked to stop. Every stop but one ends with a checkpoint:
//!
//! * SIGTERM (what `timeout`, systemd, SLURM's preemption and time limit, `kill` send),
//!   SIGHUP (the terminal closed) and SIGUSR1 (Open MPI's `mpirun` forwards it to every
//!   rank) finish the current step, write a checkpoint and exit with status 130. Any
//!   number of them changes nothing more: `timeout` sends SIGTERM to the process and then
//!   to its group, and a scheduler may repeat it; the work since the last checkpoint is
//!   never thrown away for a signal sent twice.
//! * The first SIGINT (Ctrl-C) does the same. A second SIGINT at least
//!   [`DELIBERATE_GAP`] after the first exits at once without a checkpoint (the last one
//!   written stays intact: checkpoints are renamed into place): a person pressing Ctrl-C
//!   again because they want out now. A SIGINT sooner than that is taken as the same
//!   interrupt, delivered twice (to the process and to its group, as `timeout -s INT` and
//!   some launchers do, or a key held down).
//!
//! The signals are received on a thread of their own (`signal_hook`'s iterator), so the
//! messages are printed by ordinary code, not in a signal handler.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use crate::train::INTERRUPTED;

/// The least time between two SIGINTs for the second to mean "quit without a checkpoint".
pub const DELIBERATE_GAP: Duration = Duration::from_secs(1);

/// Sets `stop` on SIGINT, SIGTERM, SIGHUP and SIGUSR1 (see the module docs); exits the
/// process on a second, deliberate SIGINT.
pub fn install(stop: Arc<AtomicBool>) -> Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1])
        .context("installing the handlers of SIGINT, SIGTERM, SIGHUP and SIGUSR1")?;
    std::thread::Builder::new()
        .name("andrea-signals".into())
        .spawn(move || {
            let mut first_sigint: Option<Instant> = None;
            for signal in signals.forever() {
                // stderr may be gone (SIGHUP after the terminal closed): never panic on it.
                let say = |line: &str| {
                    let _ = writeln!(std::io::stderr(), "\n{line}");
                };
                if signal == SIGINT {
                    match first_sigint {
                        Some(at) if at.elapsed() >= DELIBERATE_GAP => {
                            say("second Ctrl-C: exiting without a checkpoint (the last one written is intact)");
                            std::process::exit(INTERRUPTED);
                        }
                        Some(_) => continue,
                        None => first_sigint = Some(Instant::now()),
                    }
                }
                if !stop.swap(true, Ordering::SeqCst) {
                    let name = match signal {
                        SIGINT => "Ctrl-C",
                        SIGTERM => "SIGTERM",
                        SIGHUP => "SIGHUP",
                        _ => "SIGUSR1",
                    };
                    say(&format!(
                        "{name}: finishing the step and writing a checkpoint \
                         (Ctrl-C twice, a second apart, quits at once without one)"
                    ));
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
