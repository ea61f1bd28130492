//! Everything the driver writes to stdout: one JSON object a line, a whole line at a time.

use serde_json::{Map, Value};
use std::io::Write;

/// Writes one line and flushes it. The lock on stdout serialises the lines written by the command
/// loop (results) and by the event-loop task (events).
pub fn emit(line: &Value) {
    let mut out = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut out, line)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(err) = written {
        // The test has gone away: nobody is left to report to.
        eprintln!("rumqttc driver: cannot write to stdout ({err}), exiting");
        std::process::exit(1);
    }
}

/// `{"event": name, ...fields}`
pub fn event(name: &str, fields: Map<String, Value>) {
    let mut line = Map::new();
    line.insert("event".into(), name.into());
    line.extend(fields);
    emit(&Value::Object(line));
}

/// The result of command `id`: `{"id": N, "ok": true, ...fields}` or `{"id": N, "ok": false, "error": text}`.
pub fn result(id: Value, outcome: Result<Map<String, Value>, String>) {
    let mut line = Map::new();
    line.insert("id".into(), id);
    match outcome {
        Ok(fields) => {
            line.insert("ok".into(), true.into());
            line.extend(fields);
        }
        Err(error) => {
            line.insert("ok".into(), false.into());
            line.insert("error".into(), error.into());
        }
    }
    emit(&Value::Object(line));
}
