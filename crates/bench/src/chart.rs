//! A hand-written SVG bar chart of a report: one group of bars per
//! workload (and thread count, when several were run), one bar per engine,
//! a legend, and a y axis of Mops/s with round ticks.

use std::fmt::Write;

use crate::report::Report;

const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

const BAR_W: f64 = 22.0;
const GROUP_GAP: f64 = 28.0;
const LEFT: f64 = 72.0;
const TOP: f64 = 48.0;
const PLOT_H: f64 = 300.0;
const BOTTOM: f64 = 64.0;
const LEGEND_W: f64 = 190.0;

/// Escapes text for use in SVG content and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A round tick step (1, 2 or 5 × 10^k) giving about five ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    if max.is_nan() || max <= 0.0 || max.is_infinite() {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let unit = raw / mag;
    let nice = if unit <= 1.0 {
        1.0
    } else if unit <= 2.0 {
        2.0
    } else if unit <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Formats a tick value with as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// Renders the report's Mops/s as an SVG document.
pub(crate) fn render_svg(report: &Report) -> String {
    let mut engines: Vec<&str> = Vec::new();
    let mut groups: Vec<(&str, usize)> = Vec::new();
    let mut thread_counts: Vec<usize> = Vec::new();
    for r in &report.runs {
        if !engines.contains(&r.engine.as_str()) {
            engines.push(&r.engine);
        }
        if !groups.contains(&(r.workload.as_str(), r.threads)) {
            groups.push((&r.workload, r.threads));
        }
        if !thread_counts.contains(&r.threads) {
            thread_counts.push(r.threads);
        }
    }
    let mops = |e: &str, (w, t): (&str, usize)| {
        report
            .runs
            .iter()
            .find(|r| r.engine == e && r.workload == w && r.threads == t)
            .map(|r| r.mops)
    };
    let max = report.runs.iter().map(|r| r.mops).fold(0.0, f64::max);
    let step = tick_step(max);
    let top_value = (max / step).ceil().max(1.0) * step;
    let y = |v: f64| TOP + PLOT_H - v / top_value * PLOT_H;

    let group_w = engines.len().max(1) as f64 * BAR_W;
    let plot_w = (groups.len().max(1) as f64 * (group_w + GROUP_GAP)).max(200.0);
    let width = LEFT + plot_w + LEGEND_W;
    let legend_h = TOP + 20.0 * engines.len() as f64 + 20.0;
    let height = (TOP + PLOT_H + BOTTOM).max(legend_h);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="white"/>"#
    );
    let m = &report.machine;
    let title = format!(
        "pmhash bench: Mops/s ({} mode, {} durability, {} keys)",
        m.mode,
        m.durability,
        report.runs.first().map_or(0, |r| r.keys)
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        esc(&title)
    );

    // Y axis, ticks and grid lines.
    let _ = writeln!(s, r##"<g stroke="#333" stroke-width="1">"##);
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}"/>"#,
        TOP + PLOT_H
    );
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}"/>"#,
        TOP + PLOT_H,
        LEFT + plot_w
    );
    let _ = writeln!(s, "</g>");
    let ticks = (top_value / step).round() as usize;
    for i in 0..=ticks {
        let v = i as f64 * step;
        let ty = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{ty:.1}" x2="{}" y2="{ty:.1}" stroke="#ddd"/><line x1="{}" y1="{ty:.1}" x2="{LEFT}" y2="{ty:.1}" stroke="#333"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + 1.0,
            LEFT + plot_w,
            LEFT - 5.0,
            LEFT - 8.0,
            ty + 4.0,
            tick_label(v, step)
        );
    }
    let mid = TOP + PLOT_H / 2.0;
    let _ = writeln!(
        s,
        r#"<text x="18" y="{mid}" text-anchor="middle" transform="rotate(-90 18 {mid})">Mops/s</text>"#
    );

    // Bars, grouped by workload.
    for (gi, &group) in groups.iter().enumerate() {
        let gx = LEFT + GROUP_GAP / 2.0 + gi as f64 * (group_w + GROUP_GAP);
        for (ei, &e) in engines.iter().enumerate() {
            let Some(v) = mops(e, group) else { continue };
            let (bx, by) = (gx + ei as f64 * BAR_W, y(v));
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{by:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {}: {v:.3} Mops/s</title></rect>"#,
                BAR_W - 2.0,
                TOP + PLOT_H - by,
                PALETTE[ei % PALETTE.len()],
                esc(e),
                esc(group.0)
            );
        }
        let label = if thread_counts.len() > 1 {
            format!("{} ×{}", group.0, group.1)
        } else {
            group.0.to_string()
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            gx + group_w / 2.0,
            TOP + PLOT_H + 18.0,
            esc(&label)
        );
    }
    if thread_counts.len() > 1 {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">workload ×threads</text>"##,
            LEFT + plot_w / 2.0,
            TOP + PLOT_H + 40.0
        );
    }

    // Legend.
    let lx = LEFT + plot_w + 20.0;
    for (ei, e) in engines.iter().enumerate() {
        let ly = TOP + 20.0 * ei as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{ly:.1}" width="14" height="14" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            PALETTE[ei % PALETTE.len()],
            lx + 20.0,
            ly + 11.0,
            esc(e)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(tick_step(10.0), 2.0);
        assert_eq!(tick_step(7.3), 2.0);
        assert_eq!(tick_step(0.8), 0.2);
        assert_eq!(tick_step(120.0), 50.0);
        assert_eq!(tick_step(0.0), 1.0);
        assert_eq!(tick_label(0.4, 0.2), "0.4");
        assert_eq!(tick_label(40.0, 10.0), "40");
    }

    #[test]
    fn escapes() {
        assert_eq!(esc("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
    }
}
