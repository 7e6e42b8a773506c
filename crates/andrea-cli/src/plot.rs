//! `loss.svg`: the training loss (and validation loss, where measured) against the
//! step, as a plain SVG line chart any browser opens. No plotting dependency: the chart
//! is two polylines, a frame and a few labels.

use std::fmt::Write;

use crate::metrics::Metric;

const W: f64 = 800.0;
const H: f64 = 420.0;
/// Margins: left, right, top, bottom.
const ML: f64 = 70.0;
const MR: f64 = 20.0;
const MT: f64 = 30.0;
const MB: f64 = 50.0;

/// The chart of `history` (ordered by step). Empty history gives an empty frame.
pub fn loss_svg(history: &[Metric]) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r##"<rect x="{ML}" y="{MT}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        W - ML - MR,
        H - MT - MB
    );
    let losses = history
        .iter()
        .flat_map(|m| std::iter::once(m.train_loss).chain(m.val_loss))
        .filter(|l| l.is_finite());
    let (lo, hi) = losses.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), l| {
        (a.min(l), b.max(l))
    });
    if history.is_empty() || !lo.is_finite() {
        svg.push_str("</svg>\n");
        return svg;
    }
    let (lo, hi) = (lo as f64, if hi > lo { hi as f64 } else { lo as f64 + 1.0 });
    let (s0, s1) = (
        history[0].step as f64,
        history[history.len() - 1].step as f64,
    );
    let s1 = if s1 > s0 { s1 } else { s0 + 1.0 };
    let x = |s: u64| ML + (s as f64 - s0) / (s1 - s0) * (W - ML - MR);
    let y = |l: f32| MT + (hi - l as f64) / (hi - lo) * (H - MT - MB);
    let line = |points: Vec<(f64, f64)>, color: &str| {
        let pts: Vec<String> = points
            .iter()
            .map(|(a, b)| format!("{a:.1},{b:.1}"))
            .collect();
        format!(
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        )
    };
    let train: Vec<(f64, f64)> = history
        .iter()
        .filter(|m| m.train_loss.is_finite())
        .map(|m| (x(m.step), y(m.train_loss)))
        .collect();
    let val: Vec<(f64, f64)> = history
        .iter()
        .filter_map(|m| {
            m.val_loss
                .filter(|v| v.is_finite())
                .map(|v| (x(m.step), y(v)))
        })
        .collect();
    let _ = writeln!(svg, "{}", line(train, "#1f77b4"));
    if !val.is_empty() {
        for (a, b) in &val {
            let _ = writeln!(
                svg,
                r##"<circle cx="{a:.1}" cy="{b:.1}" r="3" fill="#ff7f0e"/>"##
            );
        }
        let _ = writeln!(svg, "{}", line(val, "#ff7f0e"));
    }
    let _ = writeln!(
        svg,
        r#"<text x="{ML}" y="{}" text-anchor="middle">{}</text><text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        H - MB + 18.0,
        s0,
        W - MR,
        H - MB + 18.0,
        s1
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="end">{hi:.3}</text><text x="{}" y="{}" text-anchor="end">{lo:.3}</text>"#,
        ML - 6.0,
        MT + 4.0,
        ML - 6.0,
        H - MB
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="middle">step</text><text x="{ML}" y="18">loss (nats): <tspan fill="#1f77b4">train</tspan> <tspan fill="#ff7f0e">val</tspan></text>"##,
        (ML + W - MR) / 2.0,
        H - 12.0
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_both_lines() {
        let m = |step, train_loss, val_loss| Metric {
            step,
            train_loss,
            val_loss,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_s: 1.0,
        };
        let svg = loss_svg(&[m(1, 5.0, None), m(2, 4.0, Some(4.5)), m(3, 3.0, Some(3.5))]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.ends_with("</svg>\n"));
        assert!(loss_svg(&[]).contains("</svg>"));
    }
}
