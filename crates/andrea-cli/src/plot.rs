//! `loss.svg`: the training loss against the step, drawn with `plotters` as an SVG any
//! browser opens.
//!
//! What it shows: the loss of every step, faint (one batch's loss is noisy), under an
//! exponential moving average of it that shows the trend; the validation loss as
//! markers where it was measured; a dashed vertical line at each step a run was resumed
//! from; a grid at the ticks of both axes; a legend naming each.
//!
//! The chart takes plain series ([`LossSeries`]), not `metrics.jsonl`'s lines: the
//! caller picks what to draw.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Size of the chart in pixels.
const SIZE: (u32, u32) = (900, 500);
/// Matplotlib's first two colours (blue, orange), which read apart for most forms of
/// colour blindness.
const TRAIN: RGBColor = RGBColor(31, 119, 180);
const VAL: RGBColor = RGBColor(255, 127, 14);
const RESUME: RGBColor = RGBColor(90, 90, 90);

/// The series of one chart; steps ascending.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LossSeries {
    /// (step, training loss) of every logged step.
    pub train: Vec<(u64, f32)>,
    /// (step, validation loss) where it was measured.
    pub val: Vec<(u64, f32)>,
    /// Steps a run was resumed from (the checkpoint's step).
    pub resumed_from: Vec<u64>,
}

/// How many steps the moving average spans for `n` points: about a thirtieth of the
/// run, so the trend line's lag is small next to the run, and at most 100 steps.
pub fn smoothing_span(n: usize) -> usize {
    (n / 30).clamp(1, 100)
}

/// The exponential moving average of `values` with weight `2/(span+1)` on the newest,
/// bias-corrected as Adam's moments are (`ema / (1 - decay^k)` after k values), so the
/// first values are not pulled towards 0.
pub fn ema(values: &[f32], span: usize) -> Vec<f32> {
    let alpha = 2.0 / (span as f64 + 1.0);
    let (mut avg, mut weight) = (0.0f64, 0.0f64);
    values
        .iter()
        .map(|&v| {
            avg = (1.0 - alpha) * avg + alpha * v as f64;
            weight = (1.0 - alpha) * weight + alpha;
            (avg / weight) as f32
        })
        .collect()
}

/// Points per curve beyond which a curve is thinned ([`decimate`]): about the plot's
/// width in pixels.
const BUCKETS: usize = 1000;

/// `points` thinned to at most two per bucket of `points.len() / buckets` neighbours:
/// each bucket's lowest and highest, in step order. A curve with more points than the
/// plot has pixels looks the same, its band of noise included, and a long run's chart
/// stays small (100k steps: 4k points, not 200k).
pub fn decimate(points: &[(u64, f32)], buckets: usize) -> Vec<(u64, f32)> {
    if points.len() <= 2 * buckets {
        return points.to_vec();
    }
    let by_loss = |a: &(usize, &(u64, f32)), b: &(usize, &(u64, f32))| a.1 .1.total_cmp(&b.1 .1);
    points
        .chunks(points.len().div_ceil(buckets))
        .flat_map(|bucket| {
            let lo = bucket.iter().enumerate().min_by(by_loss);
            let hi = bucket.iter().enumerate().max_by(by_loss);
            let (Some(lo), Some(hi)) = (lo, hi) else {
                return Vec::new();
            };
            let (first, second) = if lo.0 <= hi.0 { (lo, hi) } else { (hi, lo) };
            if first.0 == second.0 {
                vec![*first.1]
            } else {
                vec![*first.1, *second.1]
            }
        })
        .collect()
}

/// The chart of `series` as an SVG document. No finite loss gives a chart with empty
/// axes.
pub fn loss_svg(series: &LossSeries) -> Result<String> {
    let finite = |s: &[(u64, f32)]| -> Vec<(u64, f32)> {
        s.iter().copied().filter(|(_, l)| l.is_finite()).collect()
    };
    let (train, val) = (finite(&series.train), finite(&series.val));
    let span = smoothing_span(train.len());
    let raw: Vec<f32> = train.iter().map(|&(_, l)| l).collect();
    let smooth: Vec<(u64, f32)> = train
        .iter()
        .zip(ema(&raw, span))
        .map(|(&(s, _), l)| (s, l))
        .collect();
    // The smoothed curve has no band to keep: one point per bucket (and the last).
    let stride = smooth.len().div_ceil(2 * BUCKETS).max(1);
    let smooth: Vec<(u64, f32)> = smooth
        .iter()
        .step_by(stride)
        .chain(
            smooth
                .last()
                .filter(|_| !(smooth.len() - 1).is_multiple_of(stride)),
        )
        .copied()
        .collect();
    let raw_curve = decimate(&train, BUCKETS);

    let steps = train.iter().chain(&val).map(|&(s, _)| s);
    let first = steps.clone().min().unwrap_or(0);
    let last = steps.max().unwrap_or(1);
    // From the step before the first logged one (step 0, usually), and at least 1 wide.
    let x = first.saturating_sub(1)..last.max(first + 1);
    let losses = raw.iter().chain(val.iter().map(|(_, l)| l));
    let (lo, hi) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &l| {
        (lo.min(l as f64), hi.max(l as f64))
    });
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(0.05);
    let y = (lo - pad).max(0.0)..hi + pad;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("loss", ("sans-serif", 18))
            .margin(16)
            // Room for the last step's tick label, centred on the right edge.
            .margin_right(36)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(x.clone(), y.clone())
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss (nats)")
            .x_labels(10)
            .y_labels(8)
            .y_label_formatter(&|l| format!("{l:.2}"))
            .bold_line_style(BLACK.mix(0.15))
            .light_line_style(BLACK.mix(0.05))
            .max_light_lines(4)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(plot_error)?;

        let smoothed = span > 1;
        let (raw_style, raw_label) = if smoothed {
            (TRAIN.mix(0.25).stroke_width(1), "train, each step")
        } else {
            (TRAIN.stroke_width(2), "train")
        };
        let as_point = |&(s, l): &(u64, f32)| (s, l as f64);
        chart
            .draw_series(LineSeries::new(raw_curve.iter().map(as_point), raw_style))
            .map_err(plot_error)?
            .label(raw_label)
            .legend(move |(px, py)| PathElement::new([(px, py), (px + 20, py)], raw_style));
        if smoothed {
            chart
                .draw_series(LineSeries::new(
                    smooth.iter().map(as_point),
                    TRAIN.stroke_width(2),
                ))
                .map_err(plot_error)?
                .label(format!("train, moving average (EMA over ~{span} steps)"))
                .legend(|(px, py)| {
                    PathElement::new([(px, py), (px + 20, py)], TRAIN.stroke_width(2))
                });
        }
        if !val.is_empty() {
            // Markers a third of their spacing wide (4 px at most), so many evaluations
            // do not merge into a band.
            let spacing = (SIZE.0 as usize / val.len()) as u32;
            let radius = (spacing / 3).clamp(1, 4);
            chart
                .draw_series(LineSeries::new(
                    val.iter().map(as_point),
                    VAL.mix(0.6).stroke_width(1),
                ))
                .map_err(plot_error)?;
            chart
                .draw_series(
                    val.iter()
                        .map(|p| Circle::new(as_point(p), radius, VAL.filled())),
                )
                .map_err(plot_error)?
                .label("validation")
                .legend(|(px, py)| Circle::new((px + 10, py), 4, VAL.filled()));
        }
        for &at in series.resumed_from.iter().filter(|s| x.contains(s)) {
            let line = [(at, y.start), (at, y.end)];
            chart
                .draw_series(DashedLineSeries::new(line, 6, 4, RESUME.stroke_width(1)))
                .map_err(plot_error)?
                .label(format!("resumed from step {at}"))
                .legend(|(px, py)| {
                    PathElement::new([(px, py - 6), (px, py + 6)], RESUME.stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow!("cannot draw the loss chart: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `n` steps whose loss falls from about 9 with noise, validated every 50,
    /// resumed from `resumed`.
    fn run(n: u64, resumed: &[u64]) -> LossSeries {
        let loss = |s: u64| 2.0 + 7.0 * (-(s as f32) / 150.0).exp();
        LossSeries {
            train: (1..=n)
                .map(|s| (s, loss(s) + if s % 2 == 0 { 0.3 } else { -0.3 }))
                .collect(),
            val: (1..=n)
                .filter(|s| s % 50 == 0)
                .map(|s| (s, loss(s) + 0.1))
                .collect(),
            resumed_from: resumed.to_vec(),
        }
    }

    #[test]
    fn chart_has_grid_ticks_smoothed_curve_markers_resume_and_legend() {
        let svg = loss_svg(&run(600, &[300])).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Grid: a line per tick on both axes, and lighter ones between (plotters draws
        // the mesh as <line>s).
        assert!(svg.matches("<line").count() >= 30, "{svg}");
        // Tick labels on the step axis (every 100) and the loss axis (2 decimals).
        let texts = texts(&svg);
        for tick in ["0", "100", "300", "600", "2.00", "5.00", "9.00"] {
            assert!(
                texts.contains(&tick.to_string()),
                "no tick {tick} in {texts:?}"
            );
        }
        for label in [
            "step",
            "loss (nats)",
            "train, each step",
            "train, moving average (EMA over ~20 steps)",
            "validation",
            "resumed from step 300",
        ] {
            assert!(
                texts.contains(&label.to_string()),
                "no {label:?} in {texts:?}"
            );
        }
        // The raw curve faint, the moving average solid.
        let train = format!("stroke=\"{}\"", hex(TRAIN));
        assert!(svg.contains(&format!(r#"opacity="0.25" {train}"#)), "{svg}");
        assert!(
            svg.contains(&format!(r#"opacity="1" {train} stroke-width="2""#)),
            "{svg}"
        );
        // 12 validation markers, one more in the legend.
        assert_eq!(svg.matches("<circle").count(), 12 + 1);
        // The resume mark: dashes at its step's x, from the bottom of the plot to the top.
        let resume = format!("stroke=\"{}\"", hex(RESUME));
        assert!(svg.matches(&resume).count() > 10, "{svg}");
        // Without a resume there is no resume mark.
        let plain = loss_svg(&run(600, &[])).unwrap();
        assert!(!plain.contains("resumed") && !plain.contains(&resume));
    }

    /// The text of every `<text>` element.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
            .map(str::to_string)
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn short_and_empty_runs_still_draw() {
        let one = loss_svg(&run(1, &[])).unwrap();
        assert!(one.contains("train") && !one.contains("EMA"), "{one}");
        let empty = loss_svg(&LossSeries::default()).unwrap();
        assert!(empty.contains("</svg>"));
        let nan = LossSeries {
            train: vec![(1, f32::NAN), (2, 3.0)],
            ..LossSeries::default()
        };
        assert!(!loss_svg(&nan).unwrap().contains("NaN"));
    }

    #[test]
    fn decimation_keeps_each_buckets_extremes_in_step_order() {
        let noisy: Vec<(u64, f32)> = (0..100_000u64)
            .map(|s| (s, ((s * 7919) % 101) as f32 - (s / 1000) as f32))
            .collect();
        let thin = decimate(&noisy, 1000);
        assert!(thin.len() <= 2000 && thin.len() > 1000, "{}", thin.len());
        assert!(thin.windows(2).all(|w| w[0].0 < w[1].0));
        let extreme = |p: &[(u64, f32)]| {
            let ls = p.iter().map(|&(_, l)| l);
            (
                ls.clone().fold(f32::INFINITY, f32::min),
                ls.fold(f32::NEG_INFINITY, f32::max),
            )
        };
        assert_eq!(extreme(&thin), extreme(&noisy));
        // Every bucket of 100 keeps its own lowest and highest.
        for (bucket, kept) in noisy.chunks(100).zip(thin.chunks(2)) {
            assert_eq!(extreme(bucket), extreme(kept));
        }
        let short = &noisy[..2000];
        assert_eq!(decimate(short, 1000), short);
        let svg = loss_svg(&LossSeries {
            train: noisy,
            ..LossSeries::default()
        })
        .unwrap();
        assert!(svg.len() < 200_000, "{} bytes", svg.len());
    }

    #[test]
    fn ema_is_unbiased_at_the_start_and_follows_a_step() {
        assert_eq!(ema(&[4.0, 4.0, 4.0], 10), vec![4.0, 4.0, 4.0]);
        let e = ema(
            &[0.0; 50]
                .iter()
                .chain(&[1.0; 50])
                .copied()
                .collect::<Vec<_>>(),
            5,
        );
        assert_eq!(e[49], 0.0);
        assert!(
            e[50] > 0.0 && e[50] < 1.0 && (e[99] - 1.0).abs() < 1e-6,
            "{e:?}"
        );
        assert_eq!(smoothing_span(10), 1);
        assert_eq!(smoothing_span(600), 20);
        assert_eq!(smoothing_span(100_000), 100);
    }
}
