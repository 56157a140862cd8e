//! Line plots as hand-written SVG (no plotting crate): both axes from zero, "nice" ticks,
//! a legend in the top-left corner, where both plots of the report leave room.

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 65.0;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Line,
    /// A wide, lighter line, for a measurement another series is drawn over.
    Wide,
    Dashed,
    Markers,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: &'static str,
    pub style: Style,
}

#[derive(Clone, Debug)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// A step of 1, 2, 2.5 or 5 × 10^k giving about `ticks` intervals up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = max / ticks;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    if step > 0.0 {
        step
    } else {
        1.0
    }
}

/// The axis end: the data maximum rounded up to a whole step.
fn axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 && max.is_finite() {
        max
    } else {
        1.0
    };
    let step = nice_step(max, 5.0);
    ((max / step).ceil() * step, step)
}

/// 1500000 -> "1.5M", 250000 -> "250k", 0.5 -> "0.5".
pub fn si(value: f64) -> String {
    let (scaled, suffix) = if value.abs() >= 1e6 {
        (value / 1e6, "M")
    } else if value.abs() >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Plot {
    pub fn render(&self) -> String {
        let all = self.series.iter().flat_map(|s| s.points.iter());
        let (x_data, y_data) = all.fold((0f64, 0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
        let (x_max, x_step) = axis(x_data);
        let (y_max, y_step) = axis(y_data);
        let frame = Frame { x_max, y_max };
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"13\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        self.titles(&mut svg);
        frame.grid(&mut svg, x_step, y_step);
        for series in &self.series {
            frame.series(&mut svg, series);
        }
        self.legend(&mut svg);
        svg.push_str("</svg>\n");
        svg
    }

    fn titles(&self, svg: &mut String) {
        let mid_x = LEFT + (WIDTH - LEFT - RIGHT) / 2.0;
        let mid_y = TOP + (HEIGHT - TOP - BOTTOM) / 2.0;
        let _ = writeln!(
            svg,
            "<text x=\"{mid_x}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" \
             font-weight=\"bold\">{}</text>",
            escape(&self.title)
        );
        let _ = writeln!(
            svg,
            "<text x=\"{mid_x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            HEIGHT - 18.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            "<text x=\"22\" y=\"{mid_y}\" text-anchor=\"middle\" \
             transform=\"rotate(-90 22 {mid_y})\">{}</text>",
            escape(&self.y_label)
        );
    }

    fn legend(&self, svg: &mut String) {
        let (x, y0) = (LEFT + 14.0, TOP + 12.0);
        let width = 12.0
            + 7.0
                * self
                    .series
                    .iter()
                    .map(|s| s.name.chars().count())
                    .max()
                    .unwrap_or(0) as f64
            + 40.0;
        let height = 22.0 * self.series.len() as f64 + 6.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{y0}\" width=\"{width}\" height=\"{height}\" fill=\"white\" \
             fill-opacity=\"0.9\" stroke=\"#bbb\"/>"
        );
        for (i, series) in self.series.iter().enumerate() {
            let y = y0 + 16.0 + 22.0 * i as f64;
            let (x1, x2) = (x + 8.0, x + 36.0);
            match series.style {
                Style::Markers => marker(svg, (x1 + x2) / 2.0, y, series.color),
                style => {
                    let _ = writeln!(
                        svg,
                        "<line x1=\"{x1}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"{}\"{}/>",
                        series.color,
                        stroke(style)
                    );
                }
            }
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\">{}</text>",
                x2 + 8.0,
                y + 4.5,
                escape(&series.name)
            );
        }
    }
}

/// Stroke attributes of a line style.
fn stroke(style: Style) -> &'static str {
    match style {
        Style::Dashed => " stroke-width=\"2\" stroke-dasharray=\"7 5\"",
        Style::Wide => " stroke-width=\"5\" stroke-opacity=\"0.75\"",
        Style::Line | Style::Markers => " stroke-width=\"2.2\"",
    }
}

fn marker(svg: &mut String, x: f64, y: f64, color: &str) {
    let _ = writeln!(
        svg,
        "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\" fill=\"{color}\" stroke=\"white\"/>"
    );
}

/// Data coordinates to pixels.
struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + x / self.x_max * (WIDTH - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        HEIGHT - BOTTOM - y / self.y_max * (HEIGHT - TOP - BOTTOM)
    }

    fn grid(&self, svg: &mut String, x_step: f64, y_step: f64) {
        let (left, right) = (self.px(0.0), self.px(self.x_max));
        let (bottom, top) = (self.py(0.0), self.py(self.y_max));
        let ticks = |max: f64, step: f64| {
            let n = (max / step).round() as usize;
            (0..=n).map(move |i| i as f64 * step)
        };
        for x in ticks(self.x_max, x_step) {
            let px = self.px(x);
            let _ = writeln!(
                svg,
                "<line x1=\"{px:.1}\" y1=\"{top}\" x2=\"{px:.1}\" y2=\"{bottom}\" \
                 stroke=\"#e4e4e4\"/>\n<text x=\"{px:.1}\" y=\"{}\" \
                 text-anchor=\"middle\">{}</text>",
                bottom + 18.0,
                si(x)
            );
        }
        for y in ticks(self.y_max, y_step) {
            let py = self.py(y);
            let _ = writeln!(
                svg,
                "<line x1=\"{left}\" y1=\"{py:.1}\" x2=\"{right}\" y2=\"{py:.1}\" \
                 stroke=\"#e4e4e4\"/>\n<text x=\"{}\" y=\"{:.1}\" \
                 text-anchor=\"end\">{}</text>",
                left - 8.0,
                py + 4.5,
                si(y)
            );
        }
        let _ = writeln!(
            svg,
            "<polyline points=\"{left},{top} {left},{bottom} {right},{bottom}\" fill=\"none\" \
             stroke=\"#333\" stroke-width=\"1.2\"/>"
        );
    }

    fn series(&self, svg: &mut String, series: &Series) {
        if series.style == Style::Markers {
            for &(x, y) in &series.points {
                marker(svg, self.px(x), self.py(y), series.color);
            }
            return;
        }
        let points: Vec<String> = series
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", self.px(x), self.py(y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" \
             stroke-linejoin=\"round\"{}/>",
            points.join(" "),
            series.color,
            stroke(series.style)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes() {
        assert_eq!(axis(400_000.0), (400_000.0, 100_000.0));
        assert_eq!(axis(101_000.0), (125_000.0, 25_000.0));
        assert_eq!(axis(2.5), (2.5, 0.5));
        assert_eq!(axis(0.0), (1.0, 0.2));
    }

    #[test]
    fn si_labels() {
        assert_eq!(si(1_500_000.0), "1.5M");
        assert_eq!(si(250_000.0), "250k");
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(0.0), "0");
    }

    #[test]
    fn renders_every_series() {
        let plot = Plot {
            title: "t <&>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![
                Series {
                    name: "a".into(),
                    points: vec![(0.0, 0.0), (1.0, 2.0)],
                    color: "#1f77b4",
                    style: Style::Line,
                },
                Series {
                    name: "b".into(),
                    points: vec![(0.5, 1.0)],
                    color: "#d62728",
                    style: Style::Markers,
                },
            ],
        };
        let svg = plot.render();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert_eq!(svg.matches("<circle").count(), 2);
    }
}
