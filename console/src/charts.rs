//! Charts as inline SVG, drawn on the server from numbers only (so the page needs no script
//! and the strict Content-Security-Policy holds).

use std::fmt::{self, Write};

/// SVG markup this module built: numbers, and text it escaped itself. Templates print it
/// unescaped through `askama::filters::HtmlSafe`, which only this type implements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Svg(String);

impl fmt::Display for Svg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl askama::filters::HtmlSafe for Svg {}

impl Svg {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One line of a chart: its values, oldest first (`None`: no data for that slot), a CSS
/// class that colours it, and its name for the legend and the tooltip.
pub struct Series<'a> {
    pub name: &'a str,
    pub class: &'a str,
    pub values: &'a [Option<f64>],
    /// How the legend sums it up: counts per minute by their total, depths by the latest.
    pub summary: Summary,
}

#[derive(Clone, Copy)]
pub enum Summary {
    Total,
    Latest,
}

impl Series<'_> {
    fn summary(&self) -> String {
        let n = match self.summary {
            Summary::Total => Some(self.values.iter().flatten().sum::<f64>()),
            Summary::Latest => self.values.iter().rev().flatten().next().copied(),
        };
        match (n, self.summary) {
            // + 0.0: an empty sum is -0.0.
            (Some(n), Summary::Total) => format!("{}", n + 0.0),
            (Some(n), Summary::Latest) => format!("now {}", n + 0.0),
            (None, _) => "no data".into(),
        }
    }
}

/// Escapes text for SVG (XML) content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The largest value of all series (at least 1, so an idle chart is a flat line at zero).
fn top(series: &[Series]) -> f64 {
    series.iter().flat_map(|s| s.values.iter().flatten()).fold(1.0_f64, |m, v| m.max(*v))
}

/// Points of one series on a `width` × `height` box, `top` at the top edge; runs of `None`
/// break the line into segments.
fn segments(values: &[Option<f64>], top: f64, width: f64, height: f64) -> Vec<Vec<(f64, f64)>> {
    let step = if values.len() > 1 { width / (values.len() - 1) as f64 } else { 0.0 };
    let mut out: Vec<Vec<(f64, f64)>> = vec![];
    let mut current = vec![];
    for (i, v) in values.iter().enumerate() {
        match v {
            Some(v) => current.push((i as f64 * step, height - (v.max(0.0) / top) * height)),
            None if !current.is_empty() => out.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn polyline(out: &mut String, class: &str, points: &[(f64, f64)]) {
    let pts: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    if points.len() == 1 {
        let (x, y) = points[0];
        let _ = write!(out, r#"<circle class="{}" cx="{x:.1}" cy="{y:.1}" r="1.5"/>"#, escape(class));
    } else {
        let _ = write!(out, r#"<polyline class="{}" points="{}"/>"#, escape(class), pts.join(" "));
    }
}

/// A small chart without axes for a table cell: the series over a common scale, with a
/// tooltip giving each series' total.
pub fn sparkline(series: &[Series], width: u32, height: u32) -> Svg {
    let (w, h) = (width as f64, height as f64);
    let top = top(series);
    let title: Vec<String> = series.iter().map(|s| format!("{} {}", s.name, s.summary())).collect();
    let mut out = format!(
        r#"<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="-1 -1 {} {}" role="img"><title>{}</title>"#,
        width + 2,
        height + 2,
        escape(&title.join(", "))
    );
    for s in series {
        for seg in segments(s.values, top, w, h) {
            polyline(&mut out, s.class, &seg);
        }
    }
    out.push_str("</svg>");
    Svg(out)
}

/// A chart with its scale (the top value), a time axis from `from_label` to `to_label` and
/// a legend.
pub fn chart(title: &str, series: &[Series], from_label: &str, to_label: &str) -> Svg {
    let (w, h, left, top_pad, bottom) = (560.0, 140.0, 44.0, 8.0, 36.0);
    let top = top(series);
    let mut out = format!(
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" role="img"><title>{}</title>"#,
        left + w + 8.0,
        top_pad + h + bottom,
        escape(title)
    );
    let _ = write!(
        out,
        r#"<g class="axis"><line x1="{left}" y1="{top_pad}" x2="{left}" y2="{y}"/><line x1="{left}" y1="{y}" x2="{x}" y2="{y}"/><text x="{tx}" y="{ty}" text-anchor="end">{top}</text><text x="{tx}" y="{y}" text-anchor="end">0</text><text x="{left}" y="{ly}">{from}</text><text x="{x}" y="{ly}" text-anchor="end">{to}</text></g>"#,
        y = top_pad + h,
        x = left + w,
        tx = left - 4.0,
        ty = top_pad + 8.0,
        ly = top_pad + h + 14.0,
        top = top,
        from = escape(from_label),
        to = escape(to_label),
    );
    let _ = write!(out, r#"<g transform="translate({left} {top_pad})">"#);
    for s in series {
        for seg in segments(s.values, top, w, h) {
            polyline(&mut out, s.class, &seg);
        }
    }
    out.push_str("</g>");
    let mut x = left;
    for s in series {
        let label = format!("{} ({})", s.name, s.summary());
        let _ = write!(
            out,
            r#"<g class="legend"><rect class="{c}" x="{x}" y="{y}" width="10" height="10"/><text x="{tx}" y="{ty}">{label}</text></g>"#,
            c = escape(s.class),
            y = top_pad + h + 22.0,
            tx = x + 14.0,
            ty = top_pad + h + 31.0,
            label = escape(&label),
        );
        x += 24.0 + 7.0 * label.chars().count() as f64;
    }
    out.push_str("</svg>");
    Svg(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_scales_to_the_largest_value() {
        let a = [Some(0.0), Some(5.0), Some(10.0)];
        let svg = sparkline(&[Series { name: "done", class: "ok", values: &a, summary: Summary::Total }], 100, 20);
        let s = svg.as_str();
        assert!(s.starts_with("<svg"), "{s}");
        assert!(s.contains(r#"points="0.0,20.0 50.0,10.0 100.0,0.0""#), "{s}");
        assert!(s.contains("<title>done 15</title>"), "{s}");
    }

    #[test]
    fn gaps_break_the_line_and_a_lone_point_is_a_dot() {
        let a = [Some(1.0), Some(1.0), None, Some(1.0)];
        let s = sparkline(&[Series { name: "x", class: "c", values: &a, summary: Summary::Total }], 30, 10).0;
        assert_eq!(s.matches("<polyline").count(), 1, "{s}");
        assert_eq!(s.matches("<circle").count(), 1, "{s}");
    }

    #[test]
    fn an_idle_chart_is_flat_at_zero() {
        let a = [Some(0.0); 4];
        let s = sparkline(&[Series { name: "x", class: "c", values: &a, summary: Summary::Total }], 30, 10).0;
        assert!(s.contains(r#"points="0.0,10.0 10.0,10.0 20.0,10.0 30.0,10.0""#), "{s}");
        let none: [Option<f64>; 0] = [];
        let s = sparkline(&[Series { name: "x", class: "c", values: &none, summary: Summary::Total }], 30, 10).0;
        assert!(!s.contains("<polyline"), "{s}");
        assert!(s.contains("<title>x 0</title>"), "an empty total is 0, not -0: {s}");
        let s = sparkline(&[Series { name: "x", class: "c", values: &none, summary: Summary::Latest }], 30, 10).0;
        assert!(s.contains("<title>x no data</title>"), "{s}");
    }

    #[test]
    fn text_is_escaped() {
        let a = [Some(1.0), Some(2.0)];
        let s = chart(
            "<script>",
            &[Series { name: "a\"<b>", class: "c", values: &a, summary: Summary::Total }],
            "-60 min",
            "now",
        )
        .0;
        assert!(!s.contains("<script>"), "{s}");
        assert!(s.contains("&lt;script&gt;"), "{s}");
        assert!(s.contains("a&quot;&lt;b&gt; (3)"), "{s}");
    }

    #[test]
    fn a_chart_has_its_scale_and_legend() {
        let a = [Some(2.0), Some(8.0)];
        let b = [None, Some(3.0)];
        let s = chart(
            "depth",
            &[
                Series { name: "ready", class: "ready", values: &a, summary: Summary::Total },
                Series { name: "claimed", class: "claimed", values: &b, summary: Summary::Latest },
            ],
            "-60 min",
            "now",
        )
        .0;
        assert!(s.contains(">8</text>"), "{s}");
        assert!(s.contains("ready (10)") && s.contains("claimed (now 3)"), "{s}");
        assert!(s.contains(r#"<circle class="claimed""#), "{s}");
    }
}
