//! PNG charts of a run: claim latency against in-flight depth, throughput against consumers.

use crate::{FlatPoint, ThroughputPoint};
use plotters::prelude::*;
use std::path::Path;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers the font the charts are labelled with (Debian's fonts-dejavu-core).
fn font() -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT}: {e} (apt-get install fonts-dejavu-core)"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| "cannot load the font")?;
    Ok(())
}

const COLORS: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(120, 120, 120),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One line per (label, points, color index); x values are plotted by position (categories).
fn lines(
    path: &Path,
    title: &str,
    x_labels: &[String],
    y_label: &str,
    series: &[(String, Vec<Option<f64>>, usize)],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let y_max = series.iter().flat_map(|(_, ys, _)| ys.iter().flatten()).fold(0.0f64, |a, &b| a.max(b)) * 1.15 + 1e-9;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(x_labels.len() as f64 - 0.7), 0.0..y_max)?;
    let labels = x_labels.to_vec();
    chart
        .configure_mesh()
        .x_labels(x_labels.len())
        .x_label_formatter(&move |x| labels.get(x.round() as usize).cloned().unwrap_or_default())
        .y_desc(y_label)
        .draw()?;
    for (name, ys, i) in series {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = ys.iter().enumerate().filter_map(|(x, y)| y.map(|y| (x as f64, y))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

pub fn flatness(path: &Path, points: &[FlatPoint]) -> Result<(), Box<dyn std::error::Error>> {
    font()?;
    let mut cases: Vec<(i64, i64)> = points.iter().map(|p| (p.in_flight, p.delayed)).collect();
    cases.dedup();
    let x: Vec<String> = cases
        .iter()
        .map(|(d, l)| if *l > 0 { format!("{d} + {l} delayed") } else { format!("{d} in flight") })
        .collect();
    let series = ["pgqueue", "baseline"]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ys = cases
                .iter()
                .map(|c| {
                    points.iter().find(|p| p.system == *s && (p.in_flight, p.delayed) == *c).map(|p| p.p50_us as f64)
                })
                .collect();
            (format!("{s} claim p50"), ys, i)
        })
        .collect::<Vec<_>>();
    lines(path, "Claim latency vs rows in flight (p50, µs)", &x, "µs", &series)
}

/// Every series; `qty1_only`: only the single-job ones and pgbench (on their own scale).
pub fn throughput(path: &Path, points: &[ThroughputPoint], qty1_only: bool) -> Result<(), Box<dyn std::error::Error>> {
    font()?;
    let mut consumers: Vec<usize> = points.iter().map(|p| p.consumers).collect();
    consumers.sort();
    consumers.dedup();
    let x: Vec<String> = consumers.iter().map(|c| format!("{c} consumers")).collect();
    let series = [
        ("pgqueue", "two-call", 1),
        ("pgqueue", "two-call", 32),
        ("baseline", "two-call", 1),
        ("baseline", "two-call", 32),
        ("pgbench -N", "", 0),
        ("pgqueue", "one-call", 1),
        ("pgqueue", "one-call", 32),
        ("baseline", "one-call", 1),
        ("baseline", "one-call", 32),
    ]
    .iter()
    .enumerate()
    .filter(|(_, (_, _, q))| !qty1_only || *q <= 1)
    .filter(|(_, (s, m, q))| points.iter().any(|p| p.system == *s && p.mode == *m && p.qty == *q))
    .map(|(i, (s, m, q))| {
        let ys = consumers
            .iter()
            .map(|c| {
                points
                    .iter()
                    .find(|p| p.system == *s && p.mode == *m && p.qty == *q && p.consumers == *c)
                    .map(|p| p.jobs_per_s)
            })
            .collect();
        let name = if *q == 0 { format!("{s} tps") } else { format!("{s} {m} qty {q}") };
        (name, ys, i)
    })
    .collect::<Vec<_>>();
    let title = if qty1_only {
        "Throughput, one job per claim: jobs/s (pgbench -N: tps)"
    } else {
        "Throughput: claim + ack, jobs/s (pgbench -N: tps)"
    };
    lines(path, title, &x, "per second", &series)
}
