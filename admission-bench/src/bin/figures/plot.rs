//! Line and bar charts as SVG (plotters' SVG backend: no fonts or system libraries).

use std::error::Error;
use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// One line of a chart.
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) color: RGBColor,
    /// Drawn thin, as a reference (a capacity, a static limit).
    pub(crate) reference: bool,
}

/// One panel of lines: its title, axes and lines.
pub(crate) struct Panel<'a> {
    pub(crate) title: &'a str,
    pub(crate) x: (&'a str, Range<f64>),
    pub(crate) y: (&'a str, Range<f64>),
    pub(crate) lines: Vec<Line>,
    /// Where the legend goes, clear of the lines.
    pub(crate) legend: SeriesLabelPosition,
    /// The y axis on a log scale (its range's start above 0).
    pub(crate) log_y: bool,
    /// Each line's points marked, a shape a line, so that lines drawn over each other
    /// are told apart (for panels of few points).
    pub(crate) markers: bool,
}

pub(crate) const BLUE: RGBColor = RGBColor(31, 119, 180);
pub(crate) const ORANGE: RGBColor = RGBColor(255, 127, 14);
pub(crate) const GREEN: RGBColor = RGBColor(44, 160, 44);
pub(crate) const RED: RGBColor = RGBColor(214, 39, 40);
pub(crate) const GREY: RGBColor = RGBColor(110, 110, 110);

/// Panels stacked one above the other, written to `path`.
pub(crate) fn panels(path: &Path, panels: &[Panel<'_>]) -> Result<(), Box<dyn Error>> {
    let height = 330 * panels.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let mut chart = ChartBuilder::on(area);
        chart
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56);
        if panel.log_y {
            let y = (panel.y.1.clone()).log_scale();
            draw(chart.build_cartesian_2d(panel.x.1.clone(), y)?, panel)?;
        } else {
            draw(
                chart.build_cartesian_2d(panel.x.1.clone(), panel.y.1.clone())?,
                panel,
            )?;
        }
    }
    root.present()?;
    Ok(())
}

/// One panel's mesh, lines, markers and legend, on a linear or a log y axis.
fn draw<'a, DB, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    panel: &Panel<'_>,
) -> Result<(), Box<dyn Error>>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(panel.x.0)
        .y_desc(panel.y.0)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let mut shape = 0;
    for line in &panel.lines {
        let style = if line.reference {
            line.color.stroke_width(1)
        } else {
            line.color.stroke_width(2)
        };
        let color = line.color;
        let marked = panel.markers && !line.reference;
        let this = shape;
        shape += usize::from(marked);
        let series = chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))?
            .label(line.name.as_str());
        if marked {
            series.legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (20, 0)], color)
                    + marker(this, (10, 0), color)
            });
        } else {
            series.legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        if marked {
            chart.draw_series(
                line.points
                    .iter()
                    .map(move |&point| marker(this, point, color)),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(panel.legend.clone())
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The `shape`-th marker at `at`: a filled circle, a triangle, a cross, a ring, in turn.
fn marker<C, DB: DrawingBackend>(shape: usize, at: C, color: RGBColor) -> DynElement<'static, DB, C>
where
    C: Clone + 'static,
    Circle<C, i32>: IntoDynElement<'static, DB, C>,
    TriangleMarker<C, i32>: IntoDynElement<'static, DB, C>,
    Cross<C, i32>: IntoDynElement<'static, DB, C>,
{
    let filled = color.filled();
    match shape % 4 {
        0 => Circle::new(at, 4, filled).into_dyn(),
        1 => TriangleMarker::new(at, 5, filled).into_dyn(),
        2 => Cross::new(at, 4, color.stroke_width(2)).into_dyn(),
        _ => Circle::new(at, 4, color.stroke_width(2)).into_dyn(),
    }
}

/// A bar chart: one bar a name, its value, in one panel of several side by side.
pub(crate) struct Bars<'a> {
    pub(crate) title: &'a str,
    pub(crate) unit: &'a str,
    pub(crate) bars: Vec<(String, f64, RGBColor)>,
}

/// Bar panels side by side, written to `path`.
pub(crate) fn bars(path: &Path, panels: &[Bars<'_>]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, (450 * panels.len() as u32, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        let top = panel.bars.iter().map(|b| b.1).fold(0.0, f64::max) * 1.15;
        let names: Vec<&str> = panel.bars.iter().map(|b| b.0.as_str()).collect();
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..panel.bars.len() as f64, 0.0..top.max(1.0))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE.mix(0.0))
            .y_desc(panel.unit)
            .x_labels(panel.bars.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let at = x - 0.5;
                let i = at.round();
                if (at - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).copied().unwrap_or("").to_owned()
                } else {
                    String::new()
                }
            })
            .draw()?;
        chart.draw_series(panel.bars.iter().enumerate().map(|(i, (_, value, color))| {
            let i = i as f64;
            Rectangle::new([(i + 0.15, 0.0), (i + 0.85, *value)], color.filled())
        }))?;
        chart.draw_series(panel.bars.iter().enumerate().map(|(i, (_, value, _))| {
            Text::new(
                format!("{value:.0}"),
                (i as f64 + 0.4, *value + top * 0.02),
                ("sans-serif", 14),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}
