//! `dedup analyze --plot`: fold factor and CPU cost against the average
//! chunk size, a line per algorithm family (like the paper's Table 3 and
//! Figure 3), whole-file hashing as a dashed level, as SVG.

use std::path::Path;

use anyhow::Context;
use dedup_analyze::{Algorithm, Report};
use plotters::prelude::*;

fn family(a: &Algorithm) -> Option<&'static str> {
    match a {
        Algorithm::Wfh => None,
        Algorithm::Fbh { .. } => Some("fbh"),
        Algorithm::Rabin { .. } => Some("rabin"),
        Algorithm::Fastcdc { .. } => Some("fastcdc"),
    }
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

/// The x axis is log2 of the chunk size, labelled at whole powers of two.
fn size_label(v: &f64) -> String {
    if (v - v.round()).abs() > 1e-6 {
        return String::new();
    }
    dedup_core::size::format_size(2f64.powf(v.round()) as u64).replace(".0 ", " ")
}

/// One algorithm at one size: (log2 of the size, fold factor, CPU s).
type Point = (f64, f64, f64);
/// A panel: title, y axis name, top of the y axis, and its value.
type Panel = (&'static str, &'static str, f64, fn(&Point) -> f64);

pub fn draw(path: &Path, r: &Report) -> anyhow::Result<()> {
    // A line per family, in the order first met.
    let mut lines: Vec<(&str, Vec<Point>)> = Vec::new();
    for a in &r.algorithms {
        let (Some(f), Some(size)) = (family(&a.algorithm), a.algorithm.nominal_size()) else {
            continue;
        };
        let point = (
            (size as f64).log2(),
            a.fold_factor,
            a.chunk_cpu_s + a.hash_cpu_s,
        );
        match lines.iter_mut().find(|(name, _)| *name == f) {
            Some((_, pts)) => pts.push(point),
            None => lines.push((f, vec![point])),
        }
    }
    for (_, pts) in &mut lines {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let wfh = r.algorithms.iter().find(|a| a.algorithm == Algorithm::Wfh);
    if lines.is_empty() {
        anyhow::bail!(
            "--plot needs at least one fbh, rabin or fastcdc algorithm to draw against chunk size"
        );
    }
    let all = lines.iter().flat_map(|(_, p)| p.iter());
    let (mut x_lo, mut x_hi, mut fold_hi, mut cpu_hi) = (f64::MAX, 0.0f64, 1.0f64, 0.0f64);
    for &(x, fold, cpu) in all {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        fold_hi = fold_hi.max(fold);
        cpu_hi = cpu_hi.max(cpu);
    }
    if let Some(w) = wfh {
        fold_hi = fold_hi.max(w.fold_factor);
        cpu_hi = cpu_hi.max(w.hash_cpu_s);
    }
    x_lo -= 0.3;
    x_hi += 0.3;
    let ticks = (x_hi - x_lo).ceil() as usize + 1;
    let colors = [BLACK, BLUE, RED];
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    let panel_specs: [Panel; 2] = [
        (
            "Fold factor (logical / unique bytes)",
            "fold factor",
            fold_hi,
            |p| p.1,
        ),
        ("CPU seconds, chunking + hashing", "CPU s", cpu_hi, |p| p.2),
    ];
    for (k, (area, (title, y_desc, top, get))) in panels.iter().zip(panel_specs).enumerate() {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x_lo..x_hi, 0.0..top * 1.12)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("average (or fixed) chunk size")
            .y_desc(y_desc)
            .x_labels(ticks)
            .x_label_formatter(&size_label)
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, get(p))),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    pts.iter()
                        .map(|p| Circle::new((p.0, get(p)), 3, color.filled())),
                )
                .map_err(err)?;
        }
        if let Some(w) = wfh {
            let level = if k == 0 { w.fold_factor } else { w.hash_cpu_s };
            let gray = BLACK.mix(0.45);
            chart
                .draw_series(DashedLineSeries::new(
                    [(x_lo, level), (x_hi, level)],
                    6,
                    4,
                    gray.stroke_width(1),
                ))
                .map_err(err)?
                .label("wfh (whole files)")
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], gray.stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
