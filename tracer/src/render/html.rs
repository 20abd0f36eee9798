//! One self-contained HTML page: the summary on top, then on one time axis a state timeline per
//! thread, a CPU x time map of run-queue waits, and the GPU series. Charts are inline SVG drawn
//! with plotters; nothing is fetched from the network and no script runs.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::{
    analysis::{report::Report, summary::Summary},
    recording::{
        Recording,
        timeline::{self, State},
    },
    render::text,
};

/// Width of the time axis in pixels: a thread's states are reduced to one per pixel column.
const WIDTH: u32 = 1200;
const MAX_THREAD_ROWS: usize = 40;
const HEAT_COLUMNS: usize = 200;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn state_color(s: State) -> RGBColor {
    match s {
        State::Running => RGBColor(46, 139, 87),
        State::Runnable => RGBColor(214, 39, 40),
        State::Blocked => RGBColor(225, 225, 225),
    }
}

/// The name of the row a segmented-axis label stands for.
fn label(y: &SegmentValue<i32>, names: &[String]) -> String {
    match y {
        SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// Seconds from the window start.
fn secs(rec: &Recording, ns: u64) -> f64 {
    ns.saturating_sub(rec.start_ns) as f64 / 1e9
}

fn svg(
    height: u32,
    draw: impl FnOnce(DrawingArea<SVGBackend<'_>, plotters::coord::Shift>),
) -> String {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        let _ = root.fill(&WHITE);
        draw(root.clone());
        let _ = root.present();
    }
    out
}

/// Per thread, one bar of state changes; adjacent pixel columns in the same state become one
/// rectangle, so the SVG stays small however many switches there were.
fn thread_chart(rec: &Recording, s: &Summary) -> Option<String> {
    let timelines = rec.threads_over_time();
    if timelines.is_empty() {
        return None;
    }
    // The busiest threads first, as in the summary table; in a service of several processes,
    // grouped by process first (in the order of the processes block), each row led by its
    // process's role.
    let grouped = s.processes.len() > 1;
    let thread_of = |tid: u32| s.threads.iter().find(|t| t.tid == tid);
    let rank = |tid: u32| match grouped {
        true => s.process_rank(thread_of(tid).map_or(0, |t| t.pid)),
        false => 0,
    };
    let mut rows: Vec<u32> = s
        .threads
        .iter()
        .filter(|t| timelines.contains_key(&t.tid))
        .map(|t| t.tid)
        .collect();
    rows.sort_by_key(|tid| {
        (
            rank(*tid),
            std::cmp::Reverse(
                timelines[tid].total(State::Running) + timelines[tid].total(State::Runnable),
            ),
        )
    });
    rows.truncate(MAX_THREAD_ROWS);
    let names: Vec<String> = rows
        .iter()
        .map(|tid| {
            let t = thread_of(*tid);
            let comm = t.map_or("", |t| &t.comm);
            let role = t
                .and_then(|t| s.process(t.pid))
                .filter(|_| grouped)
                .map_or(String::new(), |p| format!("{} · ", p.role));
            format!("{role}{tid} {comm}")
        })
        .collect();
    let dur = secs(rec, rec.end_ns).max(1e-9);
    let height = 60 + 18 * rows.len() as u32;
    Some(svg(height, |root| {
        let Ok(mut chart) = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(170)
            .build_cartesian_2d(0f64..dur, (0..rows.len() as i32).into_segmented())
        else {
            return;
        };
        let _ = chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(rows.len().max(1))
            .y_label_formatter(&|y| label(y, &names))
            .x_desc("seconds")
            .draw();
        let px = dur / WIDTH as f64;
        for (row, tid) in rows.iter().enumerate() {
            let t = &timelines[tid];
            let y0 = || SegmentValue::Exact(row as i32);
            let y1 = || SegmentValue::Exact(row as i32 + 1);
            let mut cur: Option<(f64, f64, State)> = None;
            let mut rects = Vec::new();
            for i in &t.intervals {
                let (a, b) = (
                    secs(rec, i.start_ns),
                    secs(rec, i.end_ns).max(secs(rec, i.start_ns) + px),
                );
                match cur {
                    Some((ca, cb, cs)) if cs == i.state && a - cb < px => cur = Some((ca, b, cs)),
                    Some((ca, cb, cs)) if b - a < px && cb - ca >= px => {
                        // Too short to see on its own: lengthen the run before it.
                        cur = Some((ca, b.max(cb), cs))
                    }
                    _ => {
                        if let Some(run) = cur.take() {
                            rects.push(run);
                        }
                        cur = Some((a, b, i.state));
                    }
                }
            }
            rects.extend(cur);
            let _ = chart.draw_series(rects.into_iter().map(|(a, b, st)| {
                Rectangle::new([(a, y0()), (b, y1())], state_color(st).filled())
            }));
            // CUDA synchronizing calls: a thin purple band under the bar.
            let _ = chart.draw_series(timeline::cuda_spans(&rec.cuda_syncs, *tid).map(|c| {
                let (a, b) = (secs(rec, c.start_ns), secs(rec, c.end_ns));
                Rectangle::new(
                    [(a, y0()), (b.max(a + px), y1())],
                    RGBColor(128, 0, 160).mix(0.35).filled(),
                )
            }));
        }
    }))
}

/// Run-queue wait per CPU and time bin: each completed wait is spread over the bins it covers,
/// on the CPU that ended it.
fn heatmap(rec: &Recording) -> Option<String> {
    let timelines = rec.threads_over_time();
    let mut cpus: Vec<u32> = rec.host.cpus_online.clone();
    if cpus.is_empty() {
        cpus = (0..=timelines
            .values()
            .flat_map(|t| t.waits.iter().map(|w| w.1))
            .max()?)
            .collect();
    }
    let span = rec.end_ns.saturating_sub(rec.start_ns).max(1);
    let bin = span.div_ceil(HEAT_COLUMNS as u64).max(1);
    let mut grid = vec![vec![0u64; HEAT_COLUMNS]; cpus.len()];
    for ev in rec
        .timeline
        .events
        .iter()
        .filter(|e| e.event_kind() == Ok(tracer_common::EventKind::SwitchIn) && e.value > 0)
    {
        let Some(row) = cpus.iter().position(|&c| c == ev.cpu) else {
            continue;
        };
        let (a, b) = (
            ev.ts_ns.saturating_sub(ev.value).max(rec.start_ns),
            ev.ts_ns.min(rec.end_ns),
        );
        let mut t = a;
        while t < b {
            let col = ((t - rec.start_ns) / bin) as usize;
            let col_end = rec.start_ns + (col as u64 + 1) * bin;
            let until = b.min(col_end);
            if let Some(cell) = grid[row].get_mut(col) {
                *cell += until - t;
            }
            t = until;
        }
    }
    let max = grid.iter().flatten().copied().max().unwrap_or(0);
    let dur = secs(rec, rec.end_ns).max(1e-9);
    let height = 60 + 22 * cpus.len() as u32;
    Some(svg(height, |root| {
        let Ok(mut chart) = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(170)
            .build_cartesian_2d(0f64..dur, (0..cpus.len() as i32).into_segmented())
        else {
            return;
        };
        let names: Vec<String> = cpus.iter().map(|c| format!("CPU {c}")).collect();
        let _ = chart
            .configure_mesh()
            .disable_mesh()
            .y_labels(cpus.len().max(1))
            .y_label_formatter(&|y| label(y, &names))
            .x_desc("seconds")
            .draw();
        let w = bin as f64 / 1e9;
        for (row, cells) in grid.iter().enumerate() {
            let _ = chart.draw_series(cells.iter().enumerate().filter(|(_, v)| **v > 0).map(
                |(col, &v)| {
                    let x = col as f64 * w;
                    // White to red with the waiting in the cell.
                    let k = (v as f64 / max.max(1) as f64).sqrt();
                    let fade = (255.0 * (1.0 - k)) as u8;
                    Rectangle::new(
                        [
                            (x, SegmentValue::Exact(row as i32)),
                            (x + w, SegmentValue::Exact(row as i32 + 1)),
                        ],
                        RGBColor(255, fade, fade).filled(),
                    )
                },
            ));
        }
    }))
}

/// GPU utilization and GPM activity over time, on the same axis as the charts above.
fn gpu_chart(rec: &Recording) -> Option<String> {
    let g = rec.gpu.as_ref()?;
    let dur = secs(rec, rec.end_ns).max(1e-9);
    let inside = |t: u64| t >= rec.start_ns && t <= rec.end_ns;
    Some(svg(260, |root| {
        let Ok(mut chart) = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(170)
            .build_cartesian_2d(0f64..dur, 0f64..105f64)
        else {
            return;
        };
        let _ = chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("percent")
            .draw();
        let palette = [BLUE, RGBColor(255, 127, 14), RGBColor(148, 103, 189)];
        for d in &g.devices {
            let polls: Vec<_> = g
                .polls
                .iter()
                .filter(|p| p.device == d.index && inside(p.t_ns))
                .collect();
            let series: [(&str, Vec<(f64, f64)>); 3] = [
                (
                    "utilization",
                    polls
                        .iter()
                        .filter_map(|p| Some((secs(rec, p.t_ns), p.util_gpu_pct? as f64)))
                        .collect(),
                ),
                (
                    "SM activity",
                    polls
                        .iter()
                        .filter_map(|p| Some((secs(rec, p.t_ns), p.gpm?.sm_activity_pct?)))
                        .collect(),
                ),
                (
                    "tensor",
                    polls
                        .iter()
                        .filter_map(|p| Some((secs(rec, p.t_ns), p.gpm?.tensor_activity_pct?)))
                        .collect(),
                ),
            ];
            for ((name, points), color) in series.into_iter().zip(palette) {
                if points.is_empty() {
                    continue;
                }
                if let Ok(s) = chart.draw_series(LineSeries::new(points, color.stroke_width(2))) {
                    s.label(format!("GPU {} {name}", d.index))
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                        });
                }
            }
        }
        let _ = chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw();
    }))
}

pub fn render(rec: &Recording, r: &Report) -> String {
    let s = &r.summary;
    let mut html = String::new();
    let title = format!("tracer: PID {} ({})", s.pid, s.comm);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:sans-serif;margin:24px;color:#222}}\
         pre{{background:#f6f6f6;padding:12px;overflow-x:auto;font-size:12px}}\
         h2{{margin-top:28px}} .key span{{display:inline-block;width:12px;height:12px;\
         margin:0 4px 0 12px;vertical-align:middle}}</style></head><body>\n",
        esc(&title)
    );
    let _ = writeln!(html, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(html, "<pre>{}</pre>", esc(&text::render(r)));
    let _ = writeln!(
        html,
        "<h2>Threads over time</h2><p class=\"key\"><span style=\"background:#2e8b57\"></span>\
         running<span style=\"background:#d62728\"></span>waiting for a CPU\
         <span style=\"background:#e1e1e1\"></span>blocked<span style=\"background:#8000a0\">\
         </span>in a synchronizing CUDA call</p>"
    );
    match thread_chart(rec, s) {
        Some(svg) => html.push_str(&svg),
        None => html.push_str("<p>No timeline in this recording.</p>"),
    }
    let _ = writeln!(
        html,
        "<h2>Run-queue waits by CPU</h2><p>Where the target's threads waited for a CPU: darker \
         is more waiting in that CPU's run queue in that interval.</p>"
    );
    match heatmap(rec) {
        Some(svg) => html.push_str(&svg),
        None => html.push_str("<p>No run-queue waits recorded.</p>"),
    }
    let _ = writeln!(html, "<h2>GPU</h2>");
    match gpu_chart(rec) {
        Some(svg) => html.push_str(&svg),
        None => {
            let _ = write!(
                html,
                "<p>No GPU sampled: {}</p>",
                esc(&s.capabilities.gpu.reason)
            );
        }
    }
    html.push_str("\n</body></html>\n");
    html
}
