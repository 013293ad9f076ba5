//! The chart: one panel per workload, a bar per system, throughput in MB/s
//! (like Dmdedup's Figures 4-6), as SVG.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::Summary;

pub fn draw(path: &Path, summary: &[Summary]) -> anyhow::Result<()> {
    let mut panels: Vec<Vec<&Summary>> = Vec::new();
    for s in summary {
        match panels.last_mut() {
            Some(p)
                if p[0].dataset == s.dataset
                    && p[0].pattern == s.pattern
                    && p[0].phase == s.phase =>
            {
                p.push(s)
            }
            _ => panels.push(vec![s]),
        }
    }
    let per_row = 2usize;
    let rows = panels.len().div_ceil(per_row).max(1);
    let width = 640 * per_row.min(panels.len().max(1)) as u32;
    let height = 440 * rows as u32;
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
    let areas = root.split_evenly((rows, per_row.min(panels.len().max(1))));
    for (panel, area) in panels.iter().zip(areas) {
        let top = panel
            .iter()
            .map(|s| s.mb_per_s_max.max(s.mb_per_s))
            .fold(1.0, f64::max)
            * 1.15;
        let title = super::report::workload_title(panel[0]);
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(110)
            .y_label_area_size(60)
            .build_cartesian_2d((0..panel.len()).into_segmented(), 0.0..top)
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc("MB/s")
            // Labels are drawn below, by hand: plotters centres rotated
            // axis labels on the tick, so half of each would sit in the plot.
            .x_labels(panel.len())
            .x_label_formatter(&|_| String::new())
            .draw()
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        chart
            .draw_series(panel.iter().enumerate().map(|(i, s)| {
                let color = if s.system == "raw" {
                    BLACK.mix(0.6)
                } else {
                    BLUE.mix(0.6)
                };
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), s.mb_per_s),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 6, 6);
                bar
            }))
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        let label = TextStyle::from(
            ("sans-serif", 11)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .pos(Pos::new(HPos::Left, VPos::Center));
        for (i, s) in panel.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i), 0.0));
            root.draw(&Text::new(s.system.clone(), (x, y + 8), &label))
                .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        }
        // Min-max whiskers over the repetitions.
        chart
            .draw_series(panel.iter().enumerate().map(|(i, s)| {
                PathElement::new(
                    vec![
                        (SegmentValue::CenterOf(i), s.mb_per_s_min),
                        (SegmentValue::CenterOf(i), s.mb_per_s_max),
                    ],
                    RED.stroke_width(2),
                )
            }))
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
