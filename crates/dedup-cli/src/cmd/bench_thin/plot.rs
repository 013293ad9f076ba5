//! The figures of `dedup bench-thin` as one SVG: throughput against window
//! size (random and sequential, Figure 3), dedup ratio (Figure 6) and
//! compressibility (Figure 7), a line per system; and thin's metadata
//! blocks as a share of ordered's, which embeds nothing (Figure 8).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::Outcome;

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

const COLORS: [RGBColor; 4] = [BLUE, RED, BLACK, GREEN];

/// One panel: x positions are the distinct x values in order.
fn panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[(String, Vec<(String, f64)>)],
) -> anyhow::Result<()> {
    let labels: Vec<String> = lines
        .first()
        .map(|(_, pts)| pts.iter().map(|(x, _)| x.clone()).collect())
        .unwrap_or_default();
    let top = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.15;
    let n = labels.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0.0..top)
        .map_err(err)?;
    let fmt = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_labels(n * 4)
        .x_label_formatter(&fmt)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                pts.iter().enumerate().map(|(k, (_, y))| (k as f64, *y)),
                c.stroke_width(2),
            ))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(
                pts.iter()
                    .enumerate()
                    .map(|(k, (_, y))| Circle::new((k as f64, *y), 3, c.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn series(
    r: &[Outcome],
    figure: &str,
    x: impl Fn(&Outcome) -> String,
    y: impl Fn(&Outcome) -> f64,
) -> Vec<(String, Vec<(String, f64)>)> {
    let mut lines: Vec<(String, Vec<(String, f64)>)> = Vec::new();
    for o in r.iter().filter(|o| o.setting.figure == figure) {
        let p = (x(o), y(o));
        match lines.iter_mut().find(|(n, _)| *n == o.setting.system) {
            Some((_, pts)) => pts.push(p),
            None => lines.push((o.setting.system.clone(), vec![p])),
        }
    }
    lines
}

pub fn draw(path: &Path, r: &[Outcome]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((3, 2));
    let mbs = |o: &Outcome| o.mb_per_s;
    panel(
        &areas[0],
        "Fig. 3: synchronous random writes",
        "window (blocks per flush)",
        "MB/s",
        &series(r, "3-random", |o| o.setting.window.to_string(), mbs),
    )?;
    panel(
        &areas[1],
        "Fig. 3: synchronous sequential writes",
        "window (blocks per flush)",
        "MB/s",
        &series(r, "3-sequential", |o| o.setting.window.to_string(), mbs),
    )?;
    panel(
        &areas[2],
        "Fig. 6: dedup ratio (window 32, 50 % compressible)",
        "dedup ratio",
        "MB/s",
        &series(r, "6", |o| format!("{}", o.setting.dedup_ratio), mbs),
    )?;
    panel(
        &areas[3],
        "Fig. 7: compressibility (window 32, dedup 2)",
        "compressible blocks",
        "MB/s",
        &series(
            r,
            "7",
            |o| format!("{:.0}%", o.setting.compressible * 100.0),
            mbs,
        ),
    )?;
    // Figure 8: metadata blocks thin writes per block ordered writes.
    let ordered: Vec<&Outcome> = r
        .iter()
        .filter(|o| o.setting.figure == "7" && o.setting.system == "ordered")
        .collect();
    let share: Vec<(String, f64)> = r
        .iter()
        .filter(|o| o.setting.figure == "7" && o.setting.system == "thin")
        .filter_map(|o| {
            let base = ordered
                .iter()
                .find(|b| b.setting.compressible == o.setting.compressible)?;
            Some((
                format!("{:.0}%", o.setting.compressible * 100.0),
                100.0 * o.metadata_blocks as f64 / base.metadata_blocks.max(1) as f64,
            ))
        })
        .collect();
    panel(
        &areas[4],
        "Fig. 8: thin's metadata blocks, % of no embedding",
        "compressible blocks",
        "% of ordered's metadata blocks",
        &[("thin".to_string(), share)],
    )?;
    panel(
        &areas[5],
        "Request latency p99 (Fig. 3 random)",
        "window (blocks per flush)",
        "µs",
        &series(
            r,
            "3-random",
            |o| o.setting.window.to_string(),
            |o| o.p99_us,
        ),
    )?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
