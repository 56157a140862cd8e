//! Line charts as hand-written SVG, shared by the simulator's report and the benchmark's:
//! series (lines, dashed or wide lines, markers), horizontal reference lines, shaded
//! periods, event markers, a legend, and "nice" axis ticks. No dependencies.
//!
//! The y axis starts at zero; the x axis spans the data (or [`Chart::x_range`]).

use std::fmt::Write as _;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Line,
    Dashed,
    /// A wide, lighter line, for a measurement another series is drawn over.
    Wide,
    /// A dot at each point, no line: separate measurements.
    Markers,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

impl Series {
    pub fn new(name: &str, color: &'static str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            color,
            points,
            style: Style::Line,
        }
    }

    pub fn styled(mut self, style: Style) -> Series {
        self.style = style;
        self
    }

    pub fn dashed(self) -> Series {
        self.styled(Style::Dashed)
    }

    /// Stroke attributes of the plotted line (none for markers).
    fn stroke(&self) -> &'static str {
        match self.style {
            Style::Line | Style::Markers => r#" stroke-width="1.6" stroke-linejoin="round""#,
            Style::Dashed => {
                r#" stroke-width="1.6" stroke-linejoin="round" stroke-dasharray="5,3""#
            }
            Style::Wide => r#" stroke-width="5" stroke-linejoin="round" stroke-opacity="0.75""#,
        }
    }

    /// Stroke attributes of the line in the legend.
    fn legend_stroke(&self) -> &'static str {
        match self.style {
            Style::Line | Style::Markers => r#" stroke-width="2.5""#,
            Style::Dashed => r#" stroke-width="2.5" stroke-dasharray="5,3""#,
            Style::Wide => r#" stroke-width="5" stroke-opacity="0.75""#,
        }
    }
}

/// A shaded period of the x axis, labelled near the bottom; a `strip` is drawn as a
/// bar along the bottom edge only (so it can overlap other bands).
#[derive(Clone, Debug)]
pub struct Band {
    pub from: f64,
    pub to: f64,
    pub color: &'static str,
    pub label: String,
    pub strip: bool,
}

/// White outline behind text, so labels stay readable over lines.
const HALO: &str = r#"stroke="white" stroke-width="3" paint-order="stroke""#;
const STRIP: f64 = 16.0;

/// A horizontal reference line (a quota, a bound).
#[derive(Clone, Debug)]
pub struct HLine {
    pub y: f64,
    pub label: String,
    pub color: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
    pub hlines: Vec<HLine>,
    /// Vertical event markers (x, label).
    pub marks: Vec<(f64, String)>,
    /// Clip the y axis here (values above are drawn at the top edge).
    pub y_max: Option<f64>,
    pub x_range: Option<(f64, f64)>,
}

const W: f64 = 960.0;
const H: f64 = 440.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 64.0;
const BOTTOM: f64 = 56.0;

/// A round step (1, 2 or 5 × 10^k) giving about `target` intervals over `span`.
pub fn nice_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// 1,234 / 12.5k / 2M style labels.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if (x - x.round()).abs() < 1e-9 {
        format!("{}{suffix}", x.round() as i64)
    } else if x.abs() >= 100.0 || suffix.is_empty() && a >= 10.0 {
        format!("{:.0}{suffix}", x)
    } else {
        format!("{:.1}{suffix}", x)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn render(c: &Chart) -> String {
    let (x0, x1) = c.x_range.unwrap_or_else(|| {
        let xs = c.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if lo.is_finite() && hi > lo {
            (lo, hi)
        } else {
            (0.0, 1.0)
        }
    });
    let data_max = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(c.hlines.iter().map(|h| h.y))
        .fold(0.0f64, f64::max);
    let y_top = c.y_max.unwrap_or(data_max * 1.08).max(1.0);
    let y_step = nice_step(y_top, 5.0);
    let y1 = (y_top / y_step).ceil() * y_step;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - (y.clamp(0.0, y1) / y1) * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(&c.title)
    );
    // Bands, then grid, then lines.
    for b in &c.bands {
        let (a, z) = (sx(b.from.max(x0)), sx(b.to.min(x1)));
        if z <= a {
            continue;
        }
        let (y, h, opacity, label_y) = if b.strip {
            (TOP + ph - STRIP, STRIP, 0.55, TOP + ph - 4.0)
        } else {
            (TOP, ph, 0.16, TOP + ph - STRIP - 6.0)
        };
        let _ = writeln!(
            o,
            r#"<rect x="{a:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}" fill-opacity="{opacity}"/>"#,
            z - a,
            b.color
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{label_y:.1}" fill="{}" font-size="11" {}>{}</text>"#,
            a + 4.0,
            if b.strip { "#222" } else { b.color },
            if b.strip { "" } else { HALO },
            esc(&b.label)
        );
    }
    let mut y = 0.0;
    while y <= y1 + y_step / 2.0 {
        let py = sy(y);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="#ddd"/>"##,
            LEFT + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            py + 4.0,
            short_number(y)
        );
        y += y_step;
    }
    let x_step = nice_step(x1 - x0, 8.0);
    let mut x = (x0 / x_step).ceil() * x_step;
    while x <= x1 + 1e-9 {
        let px = sx(x);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{:.1}" stroke="#eee"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            o,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 16.0,
            short_number(x)
        );
        x += x_step;
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 14.0,
        esc(&c.x_label)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        esc(&c.y_label)
    );
    for (mx, label) in &c.marks {
        if *mx < x0 || *mx > x1 {
            continue;
        }
        let px = sx(*mx);
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{:.1}" stroke="#555" stroke-dasharray="2,3"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" fill="#333" font-size="11" transform="rotate(-90 {:.1} {:.1})" text-anchor="end" {HALO}>{}</text>"##,
            px - 3.0,
            TOP + 4.0,
            px - 3.0,
            TOP + 4.0,
            esc(label)
        );
    }
    for h in &c.hlines {
        let py = sy(h.y);
        let _ = writeln!(
            o,
            r#"<line x1="{LEFT}" x2="{:.1}" y1="{py:.1}" y2="{py:.1}" stroke="{}" stroke-width="1.3" stroke-dasharray="7,4"/>"#,
            LEFT + pw,
            h.color
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" fill="{}" text-anchor="end" font-size="11" {HALO}>{}</text>"#,
            LEFT + pw - 4.0,
            py - 4.0,
            h.color,
            esc(&h.label)
        );
    }
    for s in &c.series {
        let visible = s.points.iter().filter(|p| p.0 >= x0 && p.0 <= x1);
        if s.style == Style::Markers {
            for &(x, y) in visible {
                marker(&mut o, sx(x), sy(y), s.color);
            }
            continue;
        }
        let mut d = String::new();
        for (i, &(x, y)) in visible.enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                sx(x),
                sy(y)
            );
        }
        let _ = writeln!(
            o,
            r#"<path d="{d}" fill="none" stroke="{}"{}/>"#,
            s.color,
            s.stroke()
        );
    }
    // Legend: one row under the title.
    let mut lx = LEFT;
    for s in &c.series {
        if s.style == Style::Markers {
            marker(&mut o, lx + 11.0, 42.0, s.color);
        } else {
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.1}" x2="{:.1}" y1="42" y2="42" stroke="{}"{}/>"#,
                lx + 22.0,
                s.color,
                s.legend_stroke()
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="46">{}</text>"#,
            lx + 27.0,
            esc(&s.name)
        );
        lx += 40.0 + 6.6 * s.name.chars().count() as f64;
    }
    if c.y_max.is_some() && data_max > y1 {
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#a00" font-size="11">off scale above {} (max {})</text>"##,
            LEFT + pw,
            TOP - 6.0,
            short_number(y1),
            short_number(data_max)
        );
    }
    o.push_str("</svg>\n");
    o
}

fn marker(o: &mut String, x: f64, y: f64, color: &str) {
    let _ = writeln!(
        o,
        r#"<circle cx="{x:.1}" cy="{y:.1}" r="4.5" fill="{color}" stroke="white"/>"#
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, points: Vec<(f64, f64)>) -> Series {
        Series::new(name, "#1f77b4", points)
    }

    fn chart(series: Vec<Series>) -> Chart {
        Chart {
            title: "t".into(),
            series,
            ..Chart::default()
        }
    }

    /// The y axis's tick labels, bottom to top, with their pixel heights.
    fn y_ticks(svg: &str) -> Vec<(f64, String)> {
        svg.lines()
            .filter(|l| l.starts_with("<text") && l.contains(r#"text-anchor="end">"#))
            .filter(|l| l.contains(&format!(r#"x="{:.1}""#, LEFT - 6.0)))
            .map(|l| {
                let y = attr(l, "y") - 4.0;
                let text = &l[l.find('>').map_or(0, |i| i + 1)..l.len() - "</text>".len()];
                (y, text.to_string())
            })
            .collect()
    }

    fn attr(tag: &str, name: &str) -> f64 {
        let key = format!(" {name}=\"");
        let from = tag.find(&key).map(|i| i + key.len());
        let value = from.and_then(|f| tag[f..].split('"').next());
        value.and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    /// The (x, y) pixels of the first `<path>`.
    fn path_points(svg: &str) -> Vec<(f64, f64)> {
        let d = svg
            .lines()
            .find(|l| l.starts_with("<path"))
            .and_then(|l| l.split(r#"d=""#).nth(1))
            .and_then(|r| r.split('"').next())
            .unwrap_or("");
        d.split(['M', 'L'])
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                let (x, y) = p.trim().split_once(',').unwrap_or(("nan", "nan"));
                (x.parse().unwrap_or(f64::NAN), y.parse().unwrap_or(f64::NAN))
            })
            .collect()
    }

    #[test]
    fn steps_and_labels_are_round() {
        assert_eq!(nice_step(10_000.0, 5.0), 2_000.0);
        assert_eq!(nice_step(3600.0, 8.0), 500.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(nice_step(f64::NAN, 5.0), 1.0);
        assert_eq!(short_number(10_000.0), "10k");
        assert_eq!(short_number(19_200.0), "19.2k");
        assert_eq!(short_number(2_000_000.0), "2M");
        assert_eq!(short_number(1_500_000.0), "1.5M");
        assert_eq!(short_number(250.0), "250");
        assert_eq!(short_number(0.5), "0.5");
        assert_eq!(short_number(0.0), "0");
    }

    #[test]
    fn y_ticks_are_even_round_steps_from_zero_past_the_data() {
        for max in [0.7, 9.0, 100.0, 1_234.0, 99_999.0, 3.3e6] {
            let svg = render(&chart(vec![line("a", vec![(0.0, 0.0), (1.0, max)])]));
            let ticks = y_ticks(&svg);
            assert!((3..=12).contains(&ticks.len()), "{max}: {ticks:?}");
            let y_top = (max * 1.08).max(1.0);
            let step = nice_step(y_top, 5.0);
            let mantissa = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-9),
                "{max}: step {step}"
            );
            for (i, (_, label)) in ticks.iter().enumerate() {
                assert_eq!(*label, short_number(i as f64 * step), "{max}: {ticks:?}");
            }
            let top = (ticks.len() - 1) as f64 * step;
            assert!(top >= y_top && top - step < y_top, "{max}: top tick {top}");
            // Evenly spaced, zero on the bottom edge, the top tick on the top edge.
            assert!((ticks[0].0 - (H - BOTTOM)).abs() < 0.06, "{ticks:?}");
            assert!((ticks[ticks.len() - 1].0 - TOP).abs() < 0.06, "{ticks:?}");
            let gap = (ticks[0].0 - ticks[1].0).abs();
            for w in ticks.windows(2) {
                assert!(((w[0].0 - w[1].0) - gap).abs() < 0.11, "{ticks:?}");
            }
        }
    }

    #[test]
    fn points_map_linearly_onto_the_plot_area() {
        // A y top of 150 is a whole step (50): the axis ends there.
        let mut c = chart(vec![line(
            "a",
            vec![(10.0, 0.0), (15.0, 75.0), (20.0, 150.0), (30.0, 100.0)],
        )]);
        c.x_range = Some((10.0, 20.0));
        c.y_max = Some(150.0);
        let pts = path_points(&render(&c));
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let want = [
            (LEFT, TOP + ph),
            (LEFT + pw / 2.0, TOP + ph / 2.0),
            (LEFT + pw, TOP),
        ];
        // The point past the x range is left out.
        assert_eq!(pts.len(), want.len(), "{pts:?}");
        for (got, want) in pts.iter().zip(want) {
            assert!(
                (got.0 - want.0).abs() < 0.06 && (got.1 - want.1).abs() < 0.06,
                "{pts:?}"
            );
        }
    }

    #[test]
    fn values_above_a_clipped_axis_are_drawn_at_the_top_and_reported() {
        let mut c = chart(vec![line("a", vec![(0.0, 0.0), (1.0, 30.0)])]);
        c.y_max = Some(20.0);
        let svg = render(&c);
        assert!((path_points(&svg)[1].1 - TOP).abs() < 0.06);
        assert!(svg.contains("off scale above 20 (max 30)"));
        c.y_max = None;
        assert!(!render(&c).contains("off scale"));
    }

    #[test]
    fn every_style_draws_its_own_way() {
        let svg = render(&chart(vec![
            line("line", vec![(0.0, 1.0), (1.0, 2.0)]),
            line("dashed", vec![(0.0, 1.0), (1.0, 2.0)]).dashed(),
            line("wide", vec![(0.0, 1.0), (1.0, 2.0)]).styled(Style::Wide),
            line("dots", vec![(0.0, 1.0), (0.5, 1.5), (1.0, 2.0)]).styled(Style::Markers),
        ]));
        let paths: Vec<&str> = svg.lines().filter(|l| l.starts_with("<path")).collect();
        assert_eq!(paths.len(), 3, "markers draw no line");
        assert!(!paths[0].contains("dasharray") && paths[0].contains(r#"stroke-width="1.6""#));
        assert!(paths[1].contains("stroke-dasharray"));
        assert!(paths[2].contains(r#"stroke-width="5""#) && paths[2].contains("stroke-opacity"));
        // One dot a point, one in the legend.
        assert_eq!(svg.matches("<circle").count(), 4);
        for name in ["line", "dashed", "wide", "dots"] {
            assert!(
                svg.contains(&format!(">{name}</text>")),
                "legend lacks {name}"
            );
        }
    }

    #[test]
    fn every_text_is_escaped() {
        let nasty = "a <b> & \"c\" </svg>";
        let c = Chart {
            title: nasty.into(),
            x_label: nasty.into(),
            y_label: nasty.into(),
            series: vec![line(nasty, vec![(0.0, 1.0), (1.0, 30.0)])],
            bands: vec![
                Band {
                    from: 0.2,
                    to: 0.4,
                    color: "#f0a000",
                    label: nasty.into(),
                    strip: false,
                },
                Band {
                    from: 0.5,
                    to: 0.6,
                    color: "#f0a000",
                    label: nasty.into(),
                    strip: true,
                },
            ],
            hlines: vec![HLine {
                y: 10.0,
                label: nasty.into(),
                color: "#d62728",
            }],
            marks: vec![(0.5, nasty.into())],
            y_max: None,
            x_range: None,
        };
        let svg = render(&c);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("a &lt;b&gt; &amp; \"c\" &lt;/svg&gt;").count(),
            8
        );
        assert_eq!(svg.matches("</svg>").count(), 1);
        // Outside tags, no markup character is left bare.
        for l in svg.lines() {
            let mut rest = l;
            while let Some(open) = rest.find('<') {
                let text = &rest[..open];
                assert!(!text.contains('>'), "bare > in {l}");
                for (i, _) in text.match_indices('&') {
                    let entity = &text[i..];
                    assert!(
                        ["&amp;", "&lt;", "&gt;"]
                            .iter()
                            .any(|e| entity.starts_with(e)),
                        "bare & in {l}"
                    );
                }
                rest = rest[open..].split_once('>').map_or("", |(_, r)| r);
            }
            assert!(rest.is_empty(), "text after the last tag in {l}");
        }
    }
}
