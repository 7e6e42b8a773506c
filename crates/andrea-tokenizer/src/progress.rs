//! Progress bars (indicatif) for long runs, on stderr; hidden when asked, and by
//! indicatif itself when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(crate) fn bytes_bar(show: bool, total: u64, message: &'static str) -> ProgressBar {
    bar(
        show,
        total,
        message,
        "{msg:>10} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
    )
}

pub(crate) fn count_bar(show: bool, total: u64, message: &'static str) -> ProgressBar {
    bar(
        show,
        total,
        message,
        "{msg:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    )
}

fn bar(show: bool, total: u64, message: &'static str, template: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_message(message);
    bar
}
