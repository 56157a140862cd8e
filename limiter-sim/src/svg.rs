//! Line charts as hand-written SVG: series, horizontal reference lines, shaded periods,
//! event markers, a legend, and "nice" axis ticks. No dependencies.

use std::fmt::Write as _;

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    pub width: f64,
}

impl Series {
    pub fn new(name: &str, color: &'static str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            color,
            points,
            dashed: false,
            width: 1.6,
        }
    }

    pub fn dashed(mut self) -> Series {
        self.dashed = true;
        self
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
        let mut d = String::new();
        for (i, &(x, y)) in s
            .points
            .iter()
            .filter(|p| p.0 >= x0 && p.0 <= x1)
            .enumerate()
        {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                sx(x),
                sy(y)
            );
        }
        let dash = if s.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="{}" stroke-linejoin="round"{dash}/>"#,
            s.color, s.width
        );
    }
    // Legend: one row under the title.
    let mut lx = LEFT;
    for s in &c.series {
        let dash = if s.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" x2="{:.1}" y1="42" y2="42" stroke="{}" stroke-width="2.5"{dash}/>"#,
            lx + 22.0,
            s.color
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_labels_are_round() {
        assert_eq!(nice_step(10_000.0, 5.0), 2_000.0);
        assert_eq!(nice_step(3600.0, 8.0), 500.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(short_number(10_000.0), "10k");
        assert_eq!(short_number(19_200.0), "19.2k");
        assert_eq!(short_number(2_000_000.0), "2M");
        assert_eq!(short_number(250.0), "250");
        assert_eq!(short_number(0.5), "0.5");
    }

    #[test]
    fn renders_a_well_formed_chart() {
        let c = Chart {
            title: "a <b> & c".into(),
            x_label: "s".into(),
            y_label: "/s".into(),
            series: vec![Series::new(
                "admitted",
                "#1f77b4",
                vec![(0.0, 1.0), (1.0, 30.0)],
            )],
            bands: vec![Band {
                from: 0.2,
                to: 0.4,
                color: "#f0a000",
                label: "STICKY".into(),
                strip: false,
            }],
            hlines: vec![HLine {
                y: 10.0,
                label: "quota".into(),
                color: "#d62728",
            }],
            marks: vec![(0.5, "event".into())],
            y_max: Some(20.0),
            x_range: None,
        };
        let svg = render(&c);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(svg.contains("off scale above 20 (max 30)"));
        assert_eq!(svg.matches("<path").count(), 1);
    }
}
