//! The HTML report in a real browser: Debian's Chromium, headless, driven over the DevTools
//! protocol (headless_chrome), loads the page of a real recording (the cpu-contention demo,
//! which has requests and a tail) and is checked the way a user would look at it: no script
//! errors, the verdict in the first screen, each thread's running time as drawn (pixels read
//! back from the canvas) against the summary's on-CPU time, a drag on one chart zooming all of
//! them, and a click on a tail request showing its parts. Screenshots go to
//! target/test-artifacts/.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use headless_chrome::{
    Browser, LaunchOptions, Tab,
    browser::tab::point::Point,
    protocol::cdp::{Input, Page, Runtime, types::Event},
};
use serde_json::Value;
use tracer_tests::{Testload, Tracer, require_root, run_tracer, serial};

fn chromium() -> PathBuf {
    let p = PathBuf::from("/usr/bin/chromium");
    assert!(
        p.exists(),
        "the browser test needs Debian's chromium (apt-get install chromium); .ci/run installs it"
    );
    p
}

fn browser() -> Browser {
    Browser::new(LaunchOptions {
        path: Some(chromium()),
        headless: true,
        sandbox: false,
        window_size: Some((1280, 800)),
        idle_browser_timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .unwrap()
}

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn eval(tab: &Tab, js: &str) -> Value {
    let r = tab
        .evaluate(js, false)
        .unwrap_or_else(|e| panic!("{js}: {e}"));
    r.value.unwrap_or(Value::Null)
}

/// Waits for the page's next two frames: what a script changed is laid out and drawn.
fn settle(tab: &Tab) {
    tab.evaluate(
        "new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(0))))",
        true,
    )
    .unwrap();
}

fn mouse(tab: &Tab, kind: Input::DispatchMouseEventTypeOption, x: f64, y: f64, pressed: bool) {
    mouse_clicks(tab, kind, (x, y), pressed, 1);
}

/// A mouse event of the left button; `clicks` 2 makes a press a double-click's second.
fn mouse_clicks(
    tab: &Tab,
    kind: Input::DispatchMouseEventTypeOption,
    (x, y): (f64, f64),
    pressed: bool,
    clicks: u32,
) {
    tab.call_method(Input::DispatchMouseEvent {
        Type: kind,
        x,
        y,
        modifiers: None,
        timestamp: None,
        button: Some(Input::MouseButton::Left),
        buttons: Some(if pressed { 1 } else { 0 }),
        click_count: Some(clicks),
        force: None,
        tangential_pressure: None,
        tilt_x: None,
        tilt_y: None,
        twist: None,
        delta_x: None,
        delta_y: None,
        pointer_Type: None,
    })
    .unwrap();
}

fn screenshot(tab: &Tab, name: &str) {
    let png = tab
        .capture_screenshot(Page::CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    std::fs::write(artifacts().join(name), png).unwrap();
}

/// Opens `page` at `w` x `h` and waits for it to be drawn; returns the tab, the script errors
/// it reported, and the time from navigation to interactive (ms).
fn open(
    browser: &Browser,
    page: &Path,
    w: u32,
    h: u32,
) -> (Arc<Tab>, Arc<Mutex<Vec<String>>>, f64) {
    let tab = browser.new_tab().unwrap();
    tab.call_method(
        headless_chrome::protocol::cdp::Emulation::SetDeviceMetricsOverride {
            width: w,
            height: h,
            device_scale_factor: 1.0,
            mobile: false,
            scale: None,
            screen_width: None,
            screen_height: None,
            position_x: None,
            position_y: None,
            dont_set_visible_size: None,
            screen_orientation: None,
            viewport: None,
            display_feature: None,
            device_posture: None,
        },
    )
    .unwrap();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    tab.enable_runtime().unwrap();
    tab.add_event_listener(Arc::new(move |e: &Event| match e {
        Event::RuntimeExceptionThrown(x) => {
            let d = &x.params.exception_details;
            let what = d.exception.as_ref().and_then(|e| e.description.clone());
            let at = format!("line {} column {}", d.line_number, d.column_number);
            sink.lock()
                .unwrap()
                .push(format!("{}: {what:?} at {at}", d.text))
        }
        Event::RuntimeConsoleAPICalled(x)
            if matches!(
                x.params.Type,
                Runtime::ConsoleAPICalledEventTypeOption::Error
                    | Runtime::ConsoleAPICalledEventTypeOption::Warning
            ) =>
        {
            sink.lock().unwrap().push(format!("{:?}", x.params.args))
        }
        _ => {}
    }))
    .unwrap();
    let url = format!("file://{}", page.display());
    tab.navigate_to(&url)
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    let t0 = Instant::now();
    while eval(&tab, "!!(window.tracerPage && window.tracerPage.ready)") != Value::Bool(true) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the page never got ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // From the navigation's start to the page's first frame with every chart drawn and its
    // handlers bound, as the browser timed it.
    let ms = eval(&tab, "tracerPage.readyAt").as_f64().unwrap();
    (tab, errors, ms)
}

/// Running pixels per lane, read back from the lanes canvas: the share of each lane's state
/// area in the running colour.
const RUNNING_PIXELS: &str = r#"(() => {
  const P = window.tracerPage, u = P.lanesChart, bb = u.bbox;
  const cols = Math.floor(bb.width), left = Math.round(bb.left);
  const hex = getComputedStyle(document.documentElement).getPropertyValue("--run").trim();
  const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const img = u.ctx.getImageData(left, 0, cols, u.ctx.canvas.height).data;
  return JSON.stringify(P.lanes.map((l) => {
    let n = 0;
    for (let y = l.rows[0]; y < l.rows[1]; y++)
      for (let x = 0; x < cols; x++) {
        const o = (y * cols + x) * 4;
        if (img[o] === want[0] && img[o + 1] === want[1] && img[o + 2] === want[2]) n++;
      }
    const cr = l.model.cr;
    return [l.tid, n / ((l.rows[1] - l.rows[0]) * cols), cr.length ? cr[cr.length - 1] : 0];
  }));
})()"#;

/// Runs a 3-s demo of `scenario` writing its HTML page: the page's folder (the test's to
/// remove), the page and the demo's summary.
fn demo_page(scenario: &str) -> (std::path::PathBuf, std::path::PathBuf, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("tracer-html-{scenario}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join(format!("{scenario}.html"));
    let out = run_tracer(&[
        "demo",
        "--scenario",
        scenario,
        "--duration",
        "3s",
        "--json",
        "--quiet",
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    (dir, page, out.json())
}

#[test]
fn the_report_page_answers_in_a_real_browser() {
    let _guard = serial();
    require_root();
    let (dir, page, doc) = demo_page("cpu-contention");
    let browser = browser();
    let (tab, errors, ms) = open(&browser, &page, 1280, 800);
    eprintln!("the demo's page was interactive {ms:.0} ms after navigation");
    screenshot(&tab, "html-demo-1280.png");

    // The verdict leads: the summary's headline, whole, in the first screen.
    let h = eval(
        &tab,
        "(() => { const e = document.getElementById('headline'); const r = e.getBoundingClientRect(); \
         return JSON.stringify([e.textContent, r.top, r.bottom, document.documentElement.scrollWidth]); })()",
    );
    let h: Value = serde_json::from_str(h.as_str().unwrap()).unwrap();
    assert_eq!(h[0], doc["verdict"]["headline"]);
    assert!(
        h[1].as_f64().unwrap() >= 0.0 && h[2].as_f64().unwrap() <= 800.0,
        "{h}"
    );
    assert!(
        h[3].as_f64().unwrap() <= 1280.0,
        "no sideways scrolling: {h}"
    );

    // Every lane's running time against the summary's on-CPU time: one accounting (the kernel
    // side's records, and its totals), so equal to the nanosecond (the page sums integers in
    // doubles, exact this far below 2^53), also where a switch-in went untraced and the
    // kernel put the slice right by the thread's own run time (losses.unseen_switch_ins, PID 1
    // preempting the server on our VMs now and then). Then its running pixels against its
    // on-CPU share of the window: the drawing is per pixel column with the rounding carried
    // along, so it adds up to the running time within a pixel of each lane.
    let window = doc["duration_ns"].as_f64().unwrap();
    let drawn: Vec<(u64, f64, f64)> =
        serde_json::from_str(eval(&tab, RUNNING_PIXELS).as_str().unwrap()).unwrap();
    assert!(!drawn.is_empty());
    for (tid, share, running_ns) in &drawn {
        let t = doc["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tid"] == *tid)
            .unwrap();
        let oncpu = t["oncpu_ns"].as_f64().unwrap();
        assert!(
            (running_ns - oncpu).abs() < 1.0,
            "thread {tid}: the timeline ran {running_ns} ns, the totals say {oncpu} ns (losses: {})",
            doc["losses"]
        );
        let want = oncpu / window;
        assert!(
            (share - want).abs() <= 0.05 * want.max(0.02),
            "thread {tid}: drawn running {share:.4} vs on-CPU share {want:.4}"
        );
    }

    // Dragging across the lanes zooms every chart to the same range.
    let r: Value = serde_json::from_str(
        eval(
            &tab,
            "JSON.stringify((() => { document.getElementById('lanes').scrollIntoView({block: 'center'}); \
             const r = tracerPage.lanesChart.over.getBoundingClientRect(); \
             return [r.left, r.top, r.width]; })())",
        )
        .as_str()
        .unwrap(),
    )
    .unwrap();
    let (x, yy, w) = (
        r[0].as_f64().unwrap(),
        r[1].as_f64().unwrap() + 10.0,
        r[2].as_f64().unwrap(),
    );
    use Input::DispatchMouseEventTypeOption::*;
    mouse(&tab, MouseMoved, x + w * 0.25, yy, false);
    mouse(&tab, MousePressed, x + w * 0.25, yy, true);
    for k in 1..=10 {
        mouse(
            &tab,
            MouseMoved,
            x + w * (0.25 + 0.025 * k as f64),
            yy,
            true,
        );
    }
    mouse(&tab, MouseReleased, x + w * 0.5, yy, false);
    let ranges: Vec<(f64, f64)> = serde_json::from_str(
        eval(
            &tab,
            "JSON.stringify(tracerPage.charts.map((c) => [c.scales.x.min, c.scales.x.max]))",
        )
        .as_str()
        .unwrap(),
    )
    .unwrap();
    let dur = window / 1e9;
    assert!(ranges.len() >= 3, "{ranges:?}");
    let (a, b) = ranges[0];
    assert!(b - a < dur * 0.5 && a > 0.0, "zoomed in: {ranges:?}");
    for r in &ranges {
        assert!(
            (r.0 - a).abs() < 1e-9 && (r.1 - b).abs() < 1e-9,
            "{ranges:?}"
        );
    }
    screenshot(&tab, "html-demo-zoomed.png");

    // A click on a tail request's point shows its parts, which add up to its wall time.
    // (A double-click first: back to the whole window.)
    mouse(&tab, MouseMoved, x + w * 0.5, yy, false);
    mouse(&tab, MousePressed, x + w * 0.5, yy, true);
    mouse(&tab, MouseReleased, x + w * 0.5, yy, false);
    mouse_clicks(&tab, MousePressed, (x + w * 0.5, yy), true, 2);
    mouse_clicks(&tab, MouseReleased, (x + w * 0.5, yy), false, 2);
    let whole = eval(
        &tab,
        "tracerPage.charts[0].scales.x.max - tracerPage.charts[0].scales.x.min",
    );
    assert!(
        (whole.as_f64().unwrap() - dur).abs() < 1e-6,
        "reset: {whole}"
    );
    // A click on the first tail request's point. Two CI runs failed here, all three tries:
    // the point was drawn at the plot's right edge, where uPlot swallowed the click as a
    // drag's end (the page's fix, and the edge check below). Still three tries, each
    // scrolling the chart into view and waiting for two frames before it reads the point's
    // position and clicks there; a page whose clicks do nothing fails all three. Every click the page gets is kept, for the
    // message.
    eval(
        &tab,
        "window.seenClicks = []; document.addEventListener('click', (e) => seenClicks.push(\
         [e.target.className, e.clientX, e.clientY, e.offsetX, e.offsetY]), true); 0",
    );
    let mut tried = Vec::new();
    let shown = (0..3).any(|_| {
        eval(
            &tab,
            "document.getElementById('latency').scrollIntoView({block: 'center'})",
        );
        settle(&tab);
        let p: Value = serde_json::from_str(
            eval(
                &tab,
                "JSON.stringify(tracerPage.tail.length ? tracerPage.pointOf(0) : null)",
            )
            .as_str()
            .unwrap(),
        )
        .unwrap();
        assert!(
            !p.is_null(),
            "no tail request with a decomposition on the page"
        );
        let at = eval(
            &tab,
            &format!(
                "JSON.stringify((() => {{ const e = document.elementFromPoint({}, {}); \
                 const r = tracerPage.charts[0].over.getBoundingClientRect(); \
                 return [e && e.className, [r.left, r.top, r.width, r.height], scrollY]; }})())",
                p["x"], p["y"]
            ),
        );
        tried.push(format!("{p} on {at}"));
        tab.click_point(Point {
            x: p["x"].as_f64().unwrap(),
            y: p["y"].as_f64().unwrap(),
        })
        .unwrap();
        tab.wait_for_element_with_custom_timeout(
            "#detail-table tr.wall [data-ns]",
            Duration::from_secs(3),
        )
        .is_ok()
    });
    assert!(
        shown,
        "clicking a tail request shows no decomposition: clicked {tried:?}, the page got {}, \
         its handler found {}, script errors {:?}",
        eval(&tab, "JSON.stringify(seenClicks)"),
        eval(&tab, "JSON.stringify(tracerPage.lastPick || null)"),
        errors.lock().unwrap()
    );
    let parts: Vec<f64> = serde_json::from_str(
        eval(
            &tab,
            "JSON.stringify([...document.querySelectorAll('#detail-table tr.part td[data-ns]')].map((e) => +e.dataset.ns))",
        )
        .as_str()
        .unwrap(),
    )
    .unwrap();
    let wall = eval(
        &tab,
        "+document.querySelector('#detail-table tr.wall [data-ns]').dataset.ns",
    )
    .as_f64()
    .unwrap();
    let sum: f64 = parts.iter().sum();
    assert!(
        wall > 0.0 && (sum - wall).abs() <= 0.05 * wall,
        "parts {parts:?} sum {sum} vs wall {wall}"
    );
    screenshot(&tab, "html-demo-request.png");

    // A click 0.25 px inside the latency plot's right edge, where the window's last requests
    // are drawn, reaches the page's handler: uPlot took its press and release there for a
    // drag's and swallowed the click (a CI run: the first tail request was drawn there).
    eval(
        &tab,
        "tracerPage.lastPick = null; document.getElementById('latency').scrollIntoView({block: 'center'})",
    );
    settle(&tab);
    let r: Vec<f64> = serde_json::from_str(
        eval(
            &tab,
            "JSON.stringify((() => { const r = document.querySelector('#latency .u-over').getBoundingClientRect(); \
             return [r.right, r.top + r.height / 2]; })())",
        )
        .as_str()
        .unwrap(),
    )
    .unwrap();
    tab.click_point(Point {
        x: r[0] - 0.25,
        y: r[1],
    })
    .unwrap();
    settle(&tab);
    let pick = eval(&tab, "JSON.stringify(tracerPage.lastPick)");
    assert_ne!(
        pick.as_str(),
        Some("null"),
        "a click at the plot's right edge ({r:?}) ran no handler; the page got {}",
        eval(&tab, "JSON.stringify(seenClicks.slice(-1))")
    );

    // Narrow and wide windows: still no sideways scrolling, the headline still first.
    for (w, h) in [(800, 900), (2560, 1300)] {
        let (tab, errs, _) = open(&browser, &page, w, h);
        let sw = eval(&tab, "document.documentElement.scrollWidth")
            .as_f64()
            .unwrap();
        assert!(sw <= w as f64, "{w} px: the page is {sw} px wide");
        screenshot(&tab, &format!("html-demo-{w}.png"));
        assert!(
            errs.lock().unwrap().is_empty(),
            "{:?}",
            errs.lock().unwrap()
        );
    }
    assert!(
        errors.lock().unwrap().is_empty(),
        "script errors: {:?}",
        errors.lock().unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A minute of a 50-thread process (each thread spinning 200 us and sleeping 300 us, moved
/// between CPUs: about 2,000 state changes a second each, so its lanes come as bins) opens
/// and is interactive within 2 s, with every lane drawn.
#[test]
fn a_minute_of_fifty_threads_is_interactive_within_two_seconds() {
    let _guard = serial();
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-html-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("big.html");
    let mut load = Testload::spawn(&["mixed", "50"]);
    let pid = load.pid.to_string();
    let tracer = Tracer::start(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "60s",
        "--html",
        page.to_str().unwrap(),
    ]);
    // Round after round (each about 0.75 s here) until the window has ended.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(61) {
        load.send("go");
        load.expect("done");
    }
    let out = tracer.finish(Duration::from_secs(120));
    assert!(out.status.success(), "{}", out.stderr);
    drop(load);
    let size = std::fs::metadata(&page).unwrap().len();
    let browser = browser();
    let (tab, errors, ms) = open(&browser, &page, 1280, 800);
    let lanes = eval(&tab, "tracerPage.lanes.length").as_u64().unwrap();
    let marks = eval(&tab, "JSON.stringify(tracerPage.marks)");
    eprintln!(
        "60 s, 50 threads: {size} bytes, {lanes} lanes, interactive after {ms:.0} ms ({marks})"
    );
    screenshot(&tab, "html-big-1280.png");
    assert!(lanes >= 50, "{lanes} lanes");
    assert!(ms < 2000.0, "interactive after {ms:.0} ms");
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Columns of the lanes canvas in the garbage-collection colour, per lane, read back from the
/// strip above each lane's states (where CUDA syncs and collections are drawn).
const GC_COLUMNS: &str = r#"(() => {
  const P = window.tracerPage, u = P.lanesChart, bb = u.bbox;
  const cols = Math.floor(bb.width), left = Math.round(bb.left);
  const hex = getComputedStyle(document.documentElement).getPropertyValue("--gc").trim();
  const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const sh = Math.max(2, Math.round(2 * (devicePixelRatio || 1)));
  return JSON.stringify(P.lanes.map((l) => {
    const row = u.ctx.getImageData(left, l.rows[0] - sh, cols, 1).data;
    let n = 0;
    for (let x = 0; x < cols; x++)
      if (row[4 * x] === want[0] && row[4 * x + 1] === want[1] && row[4 * x + 2] === want[2]) n++;
    return [l.tid, n, cols];
  }));
})()"#;

/// The gc-pause demo's collections are drawn on their thread's lane: the columns in the
/// collection colour are the thread's collection time over the window, within two columns
/// per collection (each end rounds to a pixel, and a collection shorter than a column still
/// takes one), and no other lane has any.
#[test]
fn garbage_collections_are_drawn_on_their_threads_lane() {
    let _guard = serial();
    require_root();
    let (dir, page, doc) = demo_page("gc-pause");
    let gc = doc["gc"].as_array().expect("gc in the summary").clone();
    assert!(!gc.is_empty(), "the scenario collected: {doc}");
    let browser = browser();
    let (tab, errors, _) = open(&browser, &page, 1280, 800);
    screenshot(&tab, "html-gc-1280.png");
    let drawn: Vec<(u64, u64, u64)> =
        serde_json::from_str(eval(&tab, GC_COLUMNS).as_str().unwrap()).unwrap();
    let window = doc["duration_ns"].as_f64().unwrap();
    for (tid, n, cols) in drawn {
        let (want, slack) = match gc.iter().find(|g| g["tid"] == tid) {
            Some(g) => (
                g["total_ns"].as_f64().unwrap() / window * cols as f64,
                2.0 * g["collections"].as_f64().unwrap(),
            ),
            None => (0.0, 0.0),
        };
        assert!(
            (n as f64 - want).abs() <= slack,
            "thread {tid}: {n} columns in the collection colour, {want:.1} wanted"
        );
    }
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
