//! One line per event, to --log-file (appended) or stderr, each stamped with UTC time.

use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

static SINK: OnceLock<Mutex<Box<dyn Write + Send>>> = OnceLock::new();

pub fn init(sink: Box<dyn Write + Send>) {
    let _ = SINK.set(Mutex::new(sink));
}

/// Whether lines go to a file (main then also prints a startup error to stderr).
pub fn to_file() -> bool {
    SINK.get().is_some()
}

pub fn line(msg: &str) {
    let line = format!("{} coldstart-lazyfs[{}]: {msg}\n", now(), std::process::id());
    match SINK.get() {
        // one write per line, so lines from several threads (or daemons sharing a file) don't mix
        Some(s) => {
            let mut s = s.lock().unwrap();
            let _ = s.write_all(line.as_bytes()).and_then(|_| s.flush());
        }
        None => eprint!("{line}"),
    }
}

macro_rules! say {
    ($($arg:tt)*) => { $crate::log::line(&format!($($arg)*)) };
}
pub(crate) use say;

/// 2026-11-24T12:00:00.123Z
fn now() -> String {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = ((t.as_secs() / 86400) as i64, t.as_secs() % 86400);
    // civil date from days since 1970-01-01 (H. Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        t.subsec_millis()
    )
}
