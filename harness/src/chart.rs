//! The benchmark examples' charts (`--svg FILE`), drawn with plotters' SVG backend: one or more panels stacked in
//! one image, each with categories along x (group counts, configurations, thread counts) and one series per policy
//! or approach, as grouped bars (with an interval per bar where the example has one) or as lines; a legend beside
//! each panel; the chart's title above and a footer below naming the date, the machine and the command line, so an
//! image says where its numbers come from.
//!
//! Text is written as SVG text elements: the viewer's fonts draw it, and plotters only estimates its width, so
//! nothing here needs a font file.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

/// One bar or point: a value and, where the example has one, an interval around it (a confidence interval).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Value {
    pub value: f64,
    /// (low, high), drawn as an error bar.
    pub interval: Option<(f64, f64)>,
}

impl Value {
    /// A value without an interval.
    pub fn plain(value: f64) -> Value {
        Value { value, interval: None }
    }
}

/// One policy or approach: its name (in the legend) and its value in each category (`None`: no value there, e.g. a
/// failed cell; nothing is drawn).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<Value>>,
}

/// How a panel draws its series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Side by side within each category, one bar per series.
    Bars,
    /// One line per series through its categories (e.g. thread counts), a dot at each value.
    Lines,
}

/// One panel: categories along x, the series' values up y.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    /// What the categories are (`groups`, `threads`).
    pub x_label: String,
    /// What is measured, with its unit and which way is better.
    pub y_label: String,
    pub categories: Vec<String>,
    pub series: Vec<Series>,
    pub style: Style,
    /// A logarithmic y axis (for values spanning decades, e.g. ns per update from 1 to 1000); values and interval
    /// ends at or below zero are left out.
    pub log_y: bool,
}

/// A whole image: a title, panels stacked top to bottom, a footer.
#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub panels: Vec<Panel>,
    /// Under the panels: where the numbers come from (see [`footer`]).
    pub footer: String,
}

/// Width of an image, pixels.
const WIDTH: u32 = 1100;
/// Height of one panel, pixels.
const PANEL_HEIGHT: u32 = 380;
/// Room for the title above the panels and the footer below them.
const TITLE_HEIGHT: u32 = 44;
const FOOTER_HEIGHT: u32 = 36;
/// The legend's column, right of each panel's plot.
const LEGEND_WIDTH: u32 = 300;

/// Twenty distinguishable colours (Tableau 20: ten, then their lighter shades), one per series name in order of
/// first appearance; a twenty-first name reuses the first colour.
const COLOURS: [RGBColor; 20] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
    RGBColor(247, 182, 210),
    RGBColor(199, 199, 199),
    RGBColor(219, 219, 141),
    RGBColor(158, 218, 229),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// The categories along x: category `i` is centred at `i`, and the axis runs from -0.5 to n - 0.5, with one tick
/// (and label) per category whatever the number of categories.
#[derive(Clone, Debug)]
struct Categories(usize);

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.0.max(1) as f64;
        let at = (value + 0.5) / span;
        limit.0 + (at * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.0).map(|i| i as f64).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        -0.5..self.0 as f64 - 0.5
    }
}

impl Chart {
    /// The chart as an SVG document; an error (from plotters) names what failed.
    pub fn svg(&self) -> Result<String, String> {
        let height = TITLE_HEIGHT + FOOTER_HEIGHT + PANEL_HEIGHT * self.panels.len().max(1) as u32;
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
            root.fill(&WHITE).map_err(draw_error)?;
            let (top, rest) = root.split_vertically(TITLE_HEIGHT);
            let (body, bottom) = rest.split_vertically(height - TITLE_HEIGHT - FOOTER_HEIGHT);
            top.draw(&Text::new(self.title.clone(), (16, 14), ("sans-serif", 24).into_font().color(&BLACK)))
                .map_err(draw_error)?;
            bottom
                .draw(&Text::new(
                    self.footer.clone(),
                    (16, 10),
                    ("sans-serif", 15).into_font().color(&RGBColor(80, 80, 80)),
                ))
                .map_err(draw_error)?;
            let areas = body.split_evenly((self.panels.len().max(1), 1));
            // A series keeps its colour in every panel: colours go to names in order of first appearance.
            let mut names: Vec<&str> = Vec::new();
            for s in self.panels.iter().flat_map(|p| &p.series) {
                if !names.contains(&s.name.as_str()) {
                    names.push(&s.name);
                }
            }
            let colour_of = |name: &str| colour(names.iter().position(|n| *n == name).unwrap_or(0));
            for (panel, area) in self.panels.iter().zip(&areas) {
                draw_panel(panel, area, &colour_of)?;
            }
            root.present().map_err(draw_error)?;
        }
        Ok(out)
    }
}

impl Chart {
    /// Draws the chart into `file` (checked before the run, written now; see [`crate::OutFile`]).
    pub fn write(&self, file: crate::OutFile) -> Result<(), String> {
        file.write(&self.svg()?)
    }
}

fn draw_error(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

/// Where a value lies on the panel's y axis (log10 of it on a log axis; None where a log axis cannot show it).
fn to_axis(v: f64, log: bool) -> Option<f64> {
    match (log, v.is_finite()) {
        (_, false) => None,
        (true, _) if v <= 0.0 => None,
        (true, _) => Some(v.log10()),
        (false, _) => Some(v),
    }
}

/// The y range of a panel, in axis units: every value and interval end with a margin, and zero on a linear axis
/// (bars grow from it); whole decades on a log axis.
fn y_range(panel: &Panel) -> (f64, f64) {
    let points = panel.series.iter().flat_map(|s| s.values.iter().flatten()).flat_map(|v| {
        let (lo, hi) = v.interval.unwrap_or((v.value, v.value));
        [v.value, lo, hi]
    });
    let axis: Vec<f64> = points.filter_map(|v| to_axis(v, panel.log_y)).collect();
    let lo = axis.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = axis.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return (0.0, 1.0); // nothing to draw
    }
    if panel.log_y {
        let (lo, hi) = (lo.floor(), hi.ceil());
        return (lo, if hi > lo { hi } else { lo + 1.0 });
    }
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let pad = if hi > lo { (hi - lo) * 0.08 } else { 1.0 };
    (if lo < 0.0 { lo - pad } else { 0.0 }, if hi > 0.0 { hi + pad } else { 0.0 + pad })
}

/// A y axis label: the value itself on a linear axis, 10^v on a log axis; few significant digits either way.
fn y_tick(v: f64, log: bool) -> String {
    let x = if log { 10f64.powf(v) } else { v };
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}").trim_end_matches(".0").into()
    } else if a >= 1.0 {
        format!("{x:.2}").trim_end_matches('0').trim_end_matches('.').into()
    } else {
        // Two significant digits below 1: 0.5, 0.25, 0.00025.
        let decimals = (-a.log10()).ceil() as usize + 1;
        format!("{x:.decimals$}").trim_end_matches('0').trim_end_matches('.').into()
    }
}

fn draw_panel<DB: DrawingBackend>(
    panel: &Panel,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    colour_of: &dyn Fn(&str) -> RGBColor,
) -> Result<(), String> {
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let n = panel.categories.len();
    let (y_lo, y_hi) = y_range(panel);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&panel.title, ("sans-serif", 19))
        .margin(10)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(Categories(n), y_lo..y_hi)
        .map_err(draw_error)?;
    let log = panel.log_y;
    let names = &panel.categories;
    let x_tick = |v: &f64| {
        let i = v.round();
        if i >= 0.0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    let decades = (y_hi - y_lo).round().max(1.0) as usize;
    let y_tick = |v: &f64| y_tick(*v, log);
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .x_label_formatter(&x_tick)
        .y_label_formatter(&y_tick)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16));
    if log {
        mesh.y_labels(decades + 1);
    }
    mesh.draw().map_err(draw_error)?;
    if !log && y_lo < 0.0 {
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(-0.5, 0.0), (n as f64 - 0.5, 0.0)], BLACK)))
            .map_err(draw_error)?;
    }
    let k = panel.series.len().max(1) as f64;
    // Bars of one category share 80% of its width.
    let bar = 0.8 / k;
    for (si, series) in panel.series.iter().enumerate() {
        let c = colour_of(&series.name);
        let x_of = |ci: usize| match panel.style {
            Style::Bars => ci as f64 - 0.4 + bar * (si as f64 + 0.5),
            Style::Lines => ci as f64,
        };
        let cells: Vec<(usize, Value)> =
            series.values.iter().enumerate().filter_map(|(ci, v)| v.map(|v| (ci, v))).collect();
        match panel.style {
            Style::Bars => {
                let rects = cells.iter().filter_map(|&(ci, v)| {
                    let y = to_axis(v.value, log)?;
                    let x = x_of(ci);
                    let base = if log { y_lo } else { 0.0 };
                    Some(Rectangle::new([(x - bar * 0.45, base), (x + bar * 0.45, y)], c.filled()))
                });
                chart.draw_series(rects).map_err(draw_error)?;
            }
            Style::Lines => {
                let points: Vec<(f64, f64)> =
                    cells.iter().filter_map(|&(ci, v)| Some((x_of(ci), to_axis(v.value, log)?))).collect();
                chart.draw_series(LineSeries::new(points.clone(), c.stroke_width(2))).map_err(draw_error)?;
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled()))).map_err(draw_error)?;
            }
        }
        // Intervals: a vertical line with caps, in black over a bar, in the series' colour beside a line.
        let whisker = if panel.style == Style::Bars { BLACK } else { c };
        let cap = (bar * 0.2).min(0.06);
        for &(ci, v) in &cells {
            let Some((lo, hi)) = v.interval else { continue };
            let (Some(lo), Some(hi)) = (to_axis(lo, log), to_axis(hi, log)) else { continue };
            let x = x_of(ci);
            let lines =
                [vec![(x, lo), (x, hi)], vec![(x - cap, lo), (x + cap, lo)], vec![(x - cap, hi), (x + cap, hi)]];
            chart
                .draw_series(lines.into_iter().map(|l| PathElement::new(l, whisker.stroke_width(1))))
                .map_err(draw_error)?;
        }
    }
    // The legend: a swatch and the series' name per line, beside the plot.
    let font = ("sans-serif", 15).into_font();
    let style = font.color(&BLACK);
    for (si, series) in panel.series.iter().enumerate() {
        let y = 44 + 22 * si as i32;
        legend.draw(&Rectangle::new([(6, y), (20, y + 14)], colour_of(&series.name).filled())).map_err(draw_error)?;
        legend.draw(&Text::new(series.name.clone(), (28, y + 1), style.clone())).map_err(draw_error)?;
    }
    Ok(())
}

/// `YYYY-MM-DD` (UTC) of `secs` seconds after the Unix epoch.
pub fn date_of(secs: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm), for days on or after 1970-01-01.
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Today's date, UTC.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    date_of(secs)
}

/// This machine in a few words: the CPUs this process may use, the processor's model name where the system says
/// it (Linux's /proc/cpuinfo), the operating system and architecture.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.split_whitespace().collect::<Vec<_>>().join(" "))
    });
    let model = model.map_or(String::new(), |m| format!(" ({m})"));
    format!("{cpus} CPUs{model}, {} {}", std::env::consts::OS, std::env::consts::ARCH)
}

/// The footer of a chart drawn now by this program: the date, the machine and the command line (the program's
/// file name and its arguments).
pub fn footer() -> String {
    let mut words = std::env::args();
    let program = words.next().unwrap_or_default();
    let program = std::path::Path::new(&program).file_name().map_or(program.clone(), |f| f.to_string_lossy().into());
    let command = std::iter::once(program).chain(words).collect::<Vec<_>>().join(" ");
    format!("{} · {} · {command}", today(), machine())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contents of the SVG's text elements.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
            .collect()
    }

    fn panel(style: Style, log_y: bool) -> Panel {
        Panel {
            title: "cost versus none".into(),
            x_label: "groups".into(),
            y_label: "% (positive = slower)".into(),
            categories: vec!["1".into(), "2".into(), "4".into()],
            series: vec![
                Series {
                    name: "bitmap".into(),
                    values: vec![Some(Value { value: 3.0, interval: Some((1.0, 5.0)) }), None, Some(Value::plain(7.5))],
                },
                Series {
                    name: "mmcid <&>".into(),
                    values: vec![Some(Value { value: -1.0, interval: Some((-2.0, 0.5)) }); 3],
                },
            ],
            style,
            log_y,
        }
    }

    /// An SVG document with the title, the footer, every category, every series' name (escaped) and an error bar
    /// per interval; lines and log axes draw too, and a value the log axis cannot show is left out, not an error.
    #[test]
    fn charts_hold_their_labels() {
        let chart = Chart {
            title: "hackbench".into(),
            panels: vec![panel(Style::Bars, false), panel(Style::Lines, true)],
            footer: "2026-12-04 · test machine".into(),
        };
        let svg = chart.svg().unwrap();
        if let Ok(path) = std::env::var("MMCID_CHART_TEST_SVG") {
            std::fs::write(path, &svg).unwrap();
        }
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        let texts = texts(&svg);
        for text in ["hackbench", "2026-12-04 · test machine", "cost versus none", "groups", "4", "bitmap"] {
            assert!(texts.iter().any(|t| t == text), "no text {text:?} in the SVG: {texts:?}");
        }
        assert!(texts.iter().any(|t| t == "mmcid &lt;&amp;&gt;"), "the series' name, escaped: {texts:?}");
        assert!(svg.contains("<rect"), "bars");
        assert!(svg.contains("<polyline") || svg.contains("<path"), "lines");
        // No label from the default formatting of the category axis (e.g. "0.5").
        assert!(!texts.iter().any(|t| t.ends_with(".5")), "{texts:?}");
        // A series has one colour in every panel, even where an earlier series is missing.
        let mut later = panel(Style::Bars, false);
        later.series.remove(0);
        let two = Chart { panels: vec![panel(Style::Bars, false), later], ..chart.clone() }.svg().unwrap();
        let (blue, orange) = ("fill=\"#1F77B4\"", "fill=\"#FF7F0E\"");
        let parts: Vec<&str> = two.split("cost versus none").collect();
        assert!(parts[1].contains(blue) && parts[1].contains(orange), "bitmap blue, mmcid orange");
        assert!(parts[2].contains(orange) && !parts[2].contains(blue), "mmcid still orange, alone");
        let empty = Chart { title: "t".into(), panels: Vec::new(), footer: String::new() };
        assert!(empty.svg().unwrap().contains("<svg"));
    }

    /// The y range holds every value and interval end, and zero on a linear axis; whole decades on a log axis.
    #[test]
    fn y_ranges() {
        let (lo, hi) = y_range(&panel(Style::Bars, false));
        assert!(lo < -2.0 && hi > 7.5, "{lo} {hi}");
        let mut positive = panel(Style::Bars, false);
        positive.series.truncate(1);
        assert_eq!(y_range(&positive).0, 0.0);
        // Log: 0.5 .. 7.5 (the values at or below zero are left out) -> decades -1 .. 1.
        assert_eq!(y_range(&panel(Style::Bars, true)), (-1.0, 1.0));
        assert_eq!(y_tick(1.0, true), "10");
        assert_eq!(y_tick(2.5, false), "2.5");
        assert_eq!(y_tick(-12.25, false), "-12.2");
        assert_eq!(
            (y_tick(0.5, false), y_tick(0.25, false), y_tick(0.00025, false)),
            ("0.5".into(), "0.25".into(), "0.00025".into())
        );
        assert_eq!(y_tick(-3.0, true), "0.001");
    }

    #[test]
    fn dates() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_796_342_400), "2026-12-04");
    }
}
