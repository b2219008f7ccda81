//! The chart of a report, drawn with `plotters` as an SVG and a PNG of the
//! same picture: one column per workload (and thread count), throughput
//! (Mops/s) in the upper panel and latency (p50 bar, p99 and p99.9 ticks,
//! log scale) in the panel below it, engines named on each panel's axis
//! and coloured alike everywhere from a palette as large as the engine
//! count.
//!
//! Text is laid out with a TrueType font read at run time (`plotters`'
//! pure-Rust `ab_glyph`): `--font PATH`, or the first of [`FONT_PATHS`]
//! that exists. Both files need it (the SVG's layout measures text too).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, RunResult};

/// Where a TrueType font is looked for when `--font` is not given.
pub(crate) const FONT_PATHS: [&str; 10] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/local/share/fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

const FAMILY: &str = "sans-serif";
const PANEL_W: u32 = 460;
const ROW_H: u32 = 24;
const TITLE_H: u32 = 78;

/// The font registered with `plotters` so far (its path), if any.
static FONT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Registers the font at `explicit`, or the first of [`FONT_PATHS`] that
/// exists, for the charts' text (once per process).
fn load_font(explicit: Option<&Path>) -> Result<(), String> {
    let mut loaded = FONT.lock().unwrap_or_else(|e| e.into_inner());
    if loaded.is_some() {
        return Ok(());
    }
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => FONT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                format!(
                    "no TrueType font for the chart's text (looked for {}); install one \
                     (Debian, Ubuntu: apt-get install fonts-dejavu-core) or pass --font FILE.ttf",
                    FONT_PATHS[0]
                )
            })?,
    };
    let bytes =
        std::fs::read(&path).map_err(|e| format!("cannot read font {}: {e}", path.display()))?;
    // plotters keeps registered fonts for the life of the process; one
    // font is leaked once.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    for style in [FontStyle::Normal, FontStyle::Bold] {
        plotters::style::register_font(FAMILY, style, bytes)
            .map_err(|_| format!("{} is not a TrueType font", path.display()))?;
    }
    *loaded = Some(path);
    Ok(())
}

/// `n` distinct colours: hues a golden-ratio step apart (so engines next
/// to each other get far-apart hues), two lightnesses alternating.
pub(crate) fn palette(n: usize) -> Vec<RGBColor> {
    (0..n)
        .map(|i| {
            let hue = (0.58 + i as f64 * 0.618_033_988_75).fract();
            let light = if i % 2 == 0 { 0.45 } else { 0.62 };
            let (r, g, b) = HSLColor(hue, 0.68, light).rgb();
            RGBColor(r, g, b)
        })
        .collect()
}

/// A latency in ns, short: `850`, `12.3k`, `4.1M`, `2G`.
fn short_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0}")
    } else if ns < 1e6 {
        let k = format!("{:.1}", ns / 1e3);
        format!("{}k", k.strip_suffix(".0").unwrap_or(&k))
    } else if ns < 1e9 {
        let m = format!("{:.1}", ns / 1e6);
        format!("{}M", m.strip_suffix(".0").unwrap_or(&m))
    } else {
        let g = format!("{:.1}", ns / 1e9);
        format!("{}G", g.strip_suffix(".0").unwrap_or(&g))
    }
}

/// A key count, short: `500k`, `2M`, `1.5M`, `12345`.
fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 100_000 == 0 => {
            let m = format!("{:.1}", n as f64 / 1e6);
            format!("{}M", m.strip_suffix(".0").unwrap_or(&m))
        }
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// One panel column: a workload and thread count, and its runs in engine
/// order.
struct Group<'a> {
    label: String,
    runs: Vec<(usize, &'a RunResult)>,
}

/// The picture's content, shared by both backends.
struct Plan<'a> {
    title: String,
    groups: Vec<Group<'a>>,
    colours: Vec<RGBColor>,
    cols: usize,
    panel_h: u32,
    name_w: u32,
}

impl<'a> Plan<'a> {
    fn new(report: &'a Report) -> Plan<'a> {
        let mut engines: Vec<&str> = Vec::new();
        let mut keys: Vec<(&str, usize)> = Vec::new();
        for r in &report.runs {
            if !engines.contains(&r.engine.as_str()) {
                engines.push(&r.engine);
            }
            if !keys.contains(&(r.workload.as_str(), r.threads)) {
                keys.push((&r.workload, r.threads));
            }
        }
        let several_thread_counts = report
            .runs
            .iter()
            .any(|r| r.threads != report.runs[0].threads);
        let groups: Vec<Group<'_>> = keys
            .iter()
            .map(|&(w, t)| Group {
                label: if several_thread_counts {
                    format!("{w} ×{t}")
                } else {
                    w.to_string()
                },
                runs: engines
                    .iter()
                    .enumerate()
                    .filter_map(|(i, e)| {
                        report
                            .runs
                            .iter()
                            .find(|r| r.engine == *e && r.workload == w && r.threads == t)
                            .map(|r| (i, r))
                    })
                    .collect(),
            })
            .collect();
        let most = groups
            .iter()
            .map(|g| g.runs.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let longest = engines.iter().map(|e| e.chars().count()).max().unwrap_or(4);
        let m = &report.machine;
        let first = report.runs.first();
        let title = format!(
            "pmhash bench: {} keys, {} thread{}, {} mode, {} durability, {} (higher Mops/s and lower ns are better)",
            short_count(first.map_or(0, |r| r.keys)),
            if several_thread_counts {
                "several".to_string()
            } else {
                first.map_or(1, |r| r.threads).to_string()
            },
            if first.is_some_and(|r| r.threads == 1) && !several_thread_counts {
                ""
            } else {
                "s"
            },
            m.mode,
            m.durability,
            if m.sizing == "grown" {
                format!("tables grown from {} keys", m.initial_capacity)
            } else {
                "tables pre-sized".to_string()
            },
        );
        Plan {
            title,
            cols: groups.len().clamp(1, 3),
            colours: palette(engines.len()),
            groups,
            panel_h: 96 + ROW_H * most as u32,
            name_w: 14 + 8 * longest as u32,
        }
    }

    fn size(&self) -> (u32, u32) {
        let rows = self.groups.len().div_ceil(self.cols).max(1) as u32;
        (
            PANEL_W * self.cols as u32,
            TITLE_H + rows * 2 * self.panel_h,
        )
    }
}

type DrawResult = Result<(), String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing the chart: {e}")
}

/// Draws the whole picture on `root`.
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, plan: &Plan<'_>) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(TITLE_H);
    head.draw(&Text::new(
        plan.title.clone(),
        (12, 12),
        (FAMILY, 19).into_font(),
    ))
    .map_err(err)?;
    head.draw(&Text::new(
        "Upper panels: throughput, Mops/s. Lower panels: latency of one operation in 64, timed on its own, \
         ns (log scale): bar to p50, ticks at p99 and p99.9, labelled p50 / p99 / p99.9."
            .to_string(),
        (12, 44),
        (FAMILY, 14).into_font().color(&RGBColor(60, 60, 60)),
    ))
    .map_err(err)?;
    let rows = plan.groups.len().div_ceil(plan.cols).max(1);
    let cells = body.split_evenly((rows * 2, plan.cols));
    for (gi, group) in plan.groups.iter().enumerate() {
        let (row, col) = (gi / plan.cols, gi % plan.cols);
        throughput_panel(&cells[2 * row * plan.cols + col], plan, group)?;
        latency_panel(&cells[(2 * row + 1) * plan.cols + col], plan, group)?;
    }
    root.present().map_err(err)
}

/// The engine name of segment `v` of a panel's y axis (the first engine
/// at the top).
fn name_at(group: &Group<'_>, v: &SegmentValue<i32>) -> String {
    match v {
        SegmentValue::CenterOf(y) | SegmentValue::Exact(y) => {
            let n = group.runs.len() as i32;
            usize::try_from(n - 1 - y)
                .ok()
                .and_then(|i| group.runs.get(i))
                .map_or(String::new(), |(_, r)| r.engine.clone())
        }
        SegmentValue::Last => String::new(),
    }
}

fn throughput_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    plan: &Plan<'_>,
    group: &Group<'_>,
) -> DrawResult {
    let n = group.runs.len() as i32;
    let max = group.runs.iter().map(|(_, r)| r.mops).fold(0.0, f64::max);
    let x_max = if max > 0.0 { max * 1.3 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: throughput", group.label), (FAMILY, 17))
        .margin(8)
        .margin_right(16)
        .x_label_area_size(44)
        .y_label_area_size(plan.name_w)
        .build_cartesian_2d(0.0..x_max, (0..n.max(2) - 1).into_segmented())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n.max(2) as usize)
        .y_label_formatter(&|v| name_at(group, v))
        .x_labels(6)
        .x_desc("Mops/s")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .draw()
        .map_err(err)?;
    let label_style =
        TextStyle::from((FAMILY, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(group.runs.iter().enumerate().map(|(i, (e, r))| {
            let y = n - 1 - i as i32;
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(y)),
                    (r.mops, SegmentValue::Exact(y + 1)),
                ],
                plan.colours[*e].filled(),
            );
            bar.set_margin(3, 3, 0, 0);
            bar
        }))
        .map_err(err)?;
    chart
        .draw_series(group.runs.iter().enumerate().map(|(i, (_, r))| {
            let y = n - 1 - i as i32;
            EmptyElement::at((r.mops, SegmentValue::CenterOf(y)))
                + Text::new(format!("{:.2}", r.mops), (4, 0), label_style.clone())
        }))
        .map_err(err)?;
    Ok(())
}

fn latency_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    plan: &Plan<'_>,
    group: &Group<'_>,
) -> DrawResult {
    let n = group.runs.len() as i32;
    let timed: Vec<_> = group
        .runs
        .iter()
        .filter(|(_, r)| r.lat_ns.p50 > 0)
        .collect();
    let lo = timed
        .iter()
        .map(|(_, r)| r.lat_ns.p50 as f64)
        .fold(f64::INFINITY, f64::min);
    let hi = timed
        .iter()
        .map(|(_, r)| r.lat_ns.p999 as f64)
        .fold(1.0, f64::max);
    let lo = if lo.is_finite() {
        (lo / 2.0).max(1.0)
    } else {
        1.0
    };
    // Room right of the longest whisker for its label: the data take the
    // left 55% of the axis's decades.
    let hi = lo * (hi.max(lo * 10.0) / lo).powf(1.0 / 0.55);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{}: latency", group.label), (FAMILY, 17))
        .margin(8)
        .margin_right(16)
        .x_label_area_size(44)
        .y_label_area_size(plan.name_w)
        .build_cartesian_2d((lo..hi).log_scale(), (0..n.max(2) - 1).into_segmented())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n.max(2) as usize)
        .y_label_formatter(&|v| name_at(group, v))
        .x_labels(5)
        .x_label_formatter(&|v| short_ns(*v))
        .x_desc("ns per operation (log scale)")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 14))
        .draw()
        .map_err(err)?;
    let label_style =
        TextStyle::from((FAMILY, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let ink = RGBColor(30, 30, 30);
    for (i, (e, r)) in group.runs.iter().enumerate() {
        let l = r.lat_ns;
        if l.p50 == 0 {
            continue;
        }
        let y = n - 1 - i as i32;
        let at = |v: u64| (v as f64, SegmentValue::CenterOf(y));
        let mut bar = Rectangle::new(
            [
                (lo, SegmentValue::Exact(y)),
                (l.p50 as f64, SegmentValue::Exact(y + 1)),
            ],
            plan.colours[*e].filled(),
        );
        bar.set_margin(5, 5, 0, 0);
        chart.draw_series(std::iter::once(bar)).map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![at(l.p50), at(l.p999)],
                ink.stroke_width(1),
            )))
            .map_err(err)?;
        for (v, half) in [(l.p99, 5), (l.p999, 8)] {
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at(at(v))
                        + PathElement::new(vec![(0, -half), (0, half)], ink.stroke_width(2)),
                ))
                .map_err(err)?;
        }
        let text = format!(
            "{} / {} / {}",
            short_ns(l.p50 as f64),
            short_ns(l.p99 as f64),
            short_ns(l.p999 as f64)
        );
        chart
            .draw_series(std::iter::once(
                EmptyElement::at(at(l.p999)) + Text::new(text, (10, 0), label_style.clone()),
            ))
            .map_err(err)?;
    }
    Ok(())
}

/// The PNG written beside `svg`: the same path with extension `png`.
pub(crate) fn png_path(svg: &Path) -> PathBuf {
    svg.with_extension("png")
}

/// Writes the report's chart to `svg` and to [`png_path`]`(svg)`, with the
/// font at `font` (or a system one); creates `svg`'s directory if needed.
pub(crate) fn write(report: &Report, svg: &Path, font: Option<&Path>) -> Result<PathBuf, String> {
    if report.runs.is_empty() {
        return Err("no run to chart".to_string());
    }
    load_font(font)?;
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let plan = Plan::new(report);
    let size = plan.size();
    {
        let root = SVGBackend::new(svg, size).into_drawing_area();
        draw(&root, &plan).map_err(|e| format!("{}: {e}", svg.display()))?;
    }
    let png = png_path(svg);
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        draw(&root, &plan).map_err(|e| format!("{}: {e}", png.display()))?;
    }
    Ok(png)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palette_colours_are_distinct() {
        for n in [1, 2, 10, 16, 40] {
            let mut c: Vec<(u8, u8, u8)> = palette(n).iter().map(|c| c.rgb()).collect();
            c.sort_unstable();
            c.dedup();
            assert_eq!(c.len(), n, "{n} colours");
        }
    }

    /// A report of `engines` engines on three workloads, with latencies.
    fn synthetic(engines: usize) -> Report {
        let machine = crate::machine::Machine::detect("mapped", "strict", 0);
        let mut runs = Vec::new();
        for w in ["insert", "get-pos", "delete"] {
            for e in 0..engines {
                let mut r = crate::report::test_run(&format!("engine-{e}"), w, 1.0 + e as f64);
                r.lat_ns.p50 = 100 + 40 * e as u64;
                r.lat_ns.p99 = 4 * r.lat_ns.p50;
                r.lat_ns.p999 = 30 * r.lat_ns.p50;
                runs.push(vec![r]);
            }
        }
        Report::from_repetitions(machine, runs)
    }

    #[test]
    fn writes_svg_and_png_naming_every_engine() {
        let dir = std::env::temp_dir().join(format!("pmhash-chart-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let svg_path = dir.join("sub").join("chart.svg");
        let report = synthetic(16);
        let png_path = match write(&report, &svg_path, None) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(png_path, dir.join("sub").join("chart.png"));
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(100)]);
        for e in 0..16 {
            assert!(
                svg.contains(&format!("\nengine-{e}\n")),
                "engine-{e} not named"
            );
        }
        for w in ["insert: throughput", "delete: latency"] {
            assert!(svg.contains(w), "no {w:?} panel");
        }
        // Each engine's bars have its own colour: 16 distinct fills, each
        // on 3 throughput and 3 latency bars.
        let colours = palette(16);
        for c in &colours {
            let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            assert_eq!(svg.matches(&fill).count(), 6, "{fill}");
        }
        let png = std::fs::read(&png_path).unwrap();
        assert!(png.len() > 10_000, "{} bytes", png.len());
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_font_is_a_clear_error() {
        // Registered once per process: only a fresh process sees the
        // error, so this checks the message the search produces.
        let missing = Path::new("/no/such/font.ttf");
        let mut loaded = FONT.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.is_none() {
            drop(loaded);
            let e = load_font(Some(missing)).unwrap_err();
            assert!(e.contains("/no/such/font.ttf"), "{e}");
            loaded = FONT.lock().unwrap_or_else(|e| e.into_inner());
        }
        assert!(loaded.as_ref().is_none_or(|p| p != missing));
    }

    #[test]
    fn short_latencies() {
        assert_eq!(short_ns(850.0), "850");
        assert_eq!(short_ns(12_300.0), "12.3k");
        assert_eq!(short_ns(2_000.0), "2k");
        assert_eq!(short_ns(4_100_000.0), "4.1M");
        assert_eq!(short_ns(1_000_000.0), "1M");
        assert_eq!(short_ns(2e9), "2G");
        assert_eq!(short_count(500_000), "500k");
        assert_eq!(short_count(2_000_000), "2M");
        assert_eq!(short_count(1_500_000), "1.5M");
        assert_eq!(short_count(12_345), "12345");
    }
}
