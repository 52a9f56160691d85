//! Figures with plotters, drawn only from the numbers that are also written to CSV.
//!
//! Every figure is written twice, `name.png` (bitmap) and `name.svg` (vector). The font is
//! DejaVu Sans, embedded through the `dejavu` crate and registered once, so no system fonts
//! are needed.

use crate::error::{RaceError, Result};
use crate::tensor::Mat;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

const FONT: &str = "sans-serif";

/// Register the embedded font with plotters (idempotent).
pub fn init_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

fn perr(path: &Path, e: impl std::fmt::Display) -> RaceError {
    RaceError::io(path, format!("plotting failed: {e}"))
}

/// Draw into an RGB buffer and write it as a PNG with the strongest deflate and adaptive
/// filters (lossless; about half the size of the bitmap backend's own encoding, which keeps
/// the tracked figures light).
fn write_png(
    path: &Path,
    size: (u32, u32),
    draw: impl FnOnce(
        DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    ) -> std::result::Result<(), String>,
) -> Result<()> {
    let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        draw(root).map_err(|e| perr(path, e))?;
    }
    let file = std::fs::File::create(path).map_err(|e| perr(path, e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), size.0, size.1);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let mut w = enc.write_header().map_err(|e| perr(path, e))?;
    w.write_image_data(&rgb).map_err(|e| perr(path, e))?;
    w.finish().map_err(|e| perr(path, e))
}

/// A named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Dashed reference line (e.g. a fitted slope or bound) instead of markers.
    pub dashed: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            dashed: false,
        }
    }
    pub fn dashed(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            dashed: true,
        }
    }
}

/// Axis options of a line plot.
pub struct LinePlot<'a> {
    pub title: &'a str,
    pub xlabel: &'a str,
    pub ylabel: &'a str,
    pub logx: bool,
    pub logy: bool,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Draw a line plot to `stem.png` and `stem.svg`.
pub fn line_plot(stem: &Path, opts: &LinePlot, series: &[Series]) -> Result<()> {
    init_font();
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    write_png(&png, (900, 600), |root| draw_lines(root, opts, series))?;
    {
        let root = SVGBackend::new(&svg, (900, 600)).into_drawing_area();
        draw_lines(root, opts, series).map_err(|e| perr(&svg, e))?;
    }
    Ok(())
}

fn finite_pts(s: &Series, logx: bool, logy: bool) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .filter(|(x, y)| {
            x.is_finite() && y.is_finite() && (!logx || *x > 0.0) && (!logy || *y > 0.0)
        })
        .map(|&(x, y)| {
            (
                if logx { x.log10() } else { x },
                if logy { y.log10() } else { y },
            )
        })
        .collect()
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    o: &LinePlot,
    series: &[Series],
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| finite_pts(s, o.logx, o.logy))
        .collect();
    if all.is_empty() {
        return Err("no finite points to plot".into());
    }
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let (mut y0, mut y1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    if x1 - x0 < 1e-12 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    if y1 - y0 < 1e-12 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let (py, px) = ((y1 - y0) * 0.05, (x1 - x0) * 0.02);
    let xl = if o.logx {
        format!("{} (log10)", o.xlabel)
    } else {
        o.xlabel.to_string()
    };
    let yl = if o.logy {
        format!("{} (log10)", o.ylabel)
    } else {
        o.ylabel.to_string()
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(o.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x0 - px..x1 + px, y0 - py..y1 + py)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(xl)
        .y_desc(yl)
        .label_style((FONT, 14))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let pts = finite_pts(s, o.logx, o.logy);
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, c.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Viridis-like colour for `t ∈ [0, 1]` (piecewise-linear through five anchors).
pub fn colormap(t: f64) -> RGBColor {
    const A: [(f64, f64, f64); 5] = [
        (68., 1., 84.),
        (59., 82., 139.),
        (33., 145., 140.),
        (94., 201., 98.),
        (253., 231., 37.),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    } * 4.0;
    let i = (t.floor() as usize).min(3);
    let f = t - i as f64;
    let (a, b) = (A[i], A[i + 1]);
    RGBColor(
        (a.0 + f * (b.0 - a.0)) as u8,
        (a.1 + f * (b.1 - a.1)) as u8,
        (a.2 + f * (b.2 - a.2)) as u8,
    )
}

/// One heatmap panel: rows are queries (row 0 at the top, as a matrix reads), columns keys.
/// `range` is the colour scale's (min, max); `None` uses the panel's own.
pub struct Panel {
    pub title: String,
    pub m: Mat<f64>,
    pub range: Option<(f64, f64)>,
}

/// Draw panels in a grid (`cols` per row), each with its own colour bar and min/max stated.
pub fn heatmaps(stem: &Path, title: &str, panels: &[Panel], cols: usize) -> Result<()> {
    init_font();
    let rows = panels.len().div_ceil(cols.max(1));
    let lines = title.lines().count().max(1) as u32;
    let size = (cols as u32 * 330, rows as u32 * 330 + 20 + 20 * lines);
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    write_png(&png, size, |root| draw_heatmaps(root, title, panels, cols))?;
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        draw_heatmaps(root, title, panels, cols).map_err(|e| perr(&svg, e))?;
    }
    Ok(())
}

fn draw_heatmaps<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    panels: &[Panel],
    cols: usize,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let lines: Vec<&str> = title.lines().collect();
    let (top, body) = root.split_vertically(20 + 20 * lines.len().max(1) as u32);
    for (i, line) in lines.iter().enumerate() {
        let size = if i == 0 { 20 } else { 13 };
        top.draw(&Text::new(
            line.to_string(),
            (10, 8 + 20 * i as i32),
            (FONT, size).into_font(),
        ))
        .map_err(|e| e.to_string())?;
    }
    let rows = panels.len().div_ceil(cols.max(1));
    let areas = body.split_evenly((rows, cols));
    for (p, area) in panels.iter().zip(areas) {
        let (lo, hi) = p.range.unwrap_or_else(|| {
            p.m.data
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                    (a.min(x), b.max(x))
                })
        });
        let span = if hi > lo { hi - lo } else { 1.0 };
        let (main, bar) = area.split_horizontally(280);
        let mut chart = ChartBuilder::on(&main)
            .caption(format!("{}  [{:.3}, {:.3}]", p.title, lo, hi), (FONT, 12))
            .margin(6)
            .x_label_area_size(18)
            .y_label_area_size(26)
            .build_cartesian_2d(0..p.m.cols as i64, -(p.m.rows as i64)..0)
            .map_err(|e| e.to_string())?;
        // Row i is drawn on y ∈ [−i−1, −i] and the label at y reads −y, so row 0 is at the
        // top, as a matrix (and the paper's figure) reads.
        let ylab = |y: &i64| format!("{}", -y);
        chart
            .configure_mesh()
            .y_label_formatter(&ylab)
            .disable_mesh()
            .x_desc("key")
            .y_desc("query")
            .label_style((FONT, 9))
            .x_labels(3)
            .y_labels(3)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series((0..p.m.rows).flat_map(|i| {
                let m = &p.m;
                (0..m.cols).map(move |j| {
                    let t = (m.at(i, j) - lo) / span;
                    let (x, y) = (j as i64, -(i as i64));
                    Rectangle::new([(x, y - 1), (x + 1, y)], colormap(t).filled())
                })
            }))
            .map_err(|e| e.to_string())?;
        // Colour bar with its end values.
        let (bw, bh) = bar.dim_in_pixel();
        let h0 = 30i32;
        let h1 = bh as i32 - 30;
        for y in h0..h1 {
            let t = 1.0 - (y - h0) as f64 / (h1 - h0).max(1) as f64;
            bar.draw(&Rectangle::new(
                [(4, y), (16.min(bw as i32), y + 1)],
                colormap(t).filled(),
            ))
            .map_err(|e| e.to_string())?;
        }
        bar.draw(&Text::new(
            format!("{hi:.2}"),
            (0, h0 - 14),
            (FONT, 9).into_font(),
        ))
        .map_err(|e| e.to_string())?;
        bar.draw(&Text::new(
            format!("{lo:.2}"),
            (0, h1 + 2),
            (FONT, 9).into_font(),
        ))
        .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
