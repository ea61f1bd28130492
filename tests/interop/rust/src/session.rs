//! One connection: rumqttc's client, which queues requests, and its event loop, which does all the
//! work and has to be polled for anything to happen (requests written, acks read, reconnects). A
//! task polls it and turns what it reports into command results and events.

use crate::command::{PublishParams, SubscribeParams};
use crate::output;
use crate::tracker::{Acknowledgement, Kind, Reply, Tracker, Written};
use rumqttc::Outgoing;
use serde_json::{Map, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{self, Instant};

/// Room in rumqttc's request queue; the driver queues one request per command.
pub const REQUEST_QUEUE: usize = 1024;
/// Largest packet either way (rumqttc's default is 10 KiB): the largest MQTT allows.
pub const MAX_PACKET: usize = 268_435_455;
/// Packet ids rumqttc may have unacknowledged (its default is 100): all of them.
pub const INFLIGHT: u16 = u16::MAX;
/// rumqttc reconnects when its event loop is polled again after an error; the pause between
/// those polls (the README wants a first retry within 1 s of the loss).
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// How long the driver goes on reconnecting before it gives up on the connection.
const GIVE_UP_RECONNECTING: Duration = Duration::from_mins(5);

/// The requests of one MQTT version's client, queued without waiting (rumqttc's `try_*` calls).
pub trait Requests: Send {
    fn publish(&self, params: &PublishParams) -> Result<(), String>;
    fn subscribe(&self, params: &SubscribeParams) -> Result<(), String>;
    fn unsubscribe(&self, filter: &str) -> Result<(), String>;
    fn disconnect(&self) -> Result<(), String>;
}

/// rumqttc's own check of a topic name, which its client applies before queueing a publish: the
/// driver asks first, to tell why the publish is refused.
pub fn valid_topic(topic: &str) -> Result<(), String> {
    if rumqttc::valid_topic(topic) {
        return Ok(());
    }
    Err(format!("field 'topic': rumqttc refuses {topic:?} (a wildcard in a topic name)"))
}

/// rumqttc's own check of a topic filter, as `valid_topic`.
pub fn valid_filter(filter: &str) -> Result<(), String> {
    if rumqttc::valid_filter(filter) {
        return Ok(());
    }
    Err(format!("field 'filter': rumqttc refuses {filter:?} (not a valid topic filter)"))
}

/// What one poll of rumqttc's event loop reported, in the driver's terms.
pub enum Progress {
    Connected {
        session_present: bool,
    },
    Written(Written),
    Acked(Acknowledgement),
    Message(Map<String, Value>),
    /// The DISCONNECT the test asked for is written: the connection is done.
    DisconnectWritten,
    /// Pings and the acks rumqttc sends itself.
    Nothing,
}

impl Progress {
    /// What rumqttc wrote out: both versions' event loops report it as the same `Outgoing`.
    pub fn outgoing(outgoing: Outgoing) -> Progress {
        match outgoing {
            Outgoing::Publish(pkid) => Progress::Written(Written::Publish(pkid)),
            Outgoing::Subscribe(pkid) => Progress::Written(Written::Subscribe(pkid)),
            Outgoing::Unsubscribe(pkid) => Progress::Written(Written::Unsubscribe(pkid)),
            Outgoing::Disconnect => Progress::DisconnectWritten,
            _ => Progress::Nothing,
        }
    }
}

/// One MQTT version's event loop.
pub trait EventLoop: Send + 'static {
    fn poll(&mut self) -> impl Future<Output = Result<Progress, String>> + Send;
    /// The driver's requests that rumqttc took back from a lost connection without having written
    /// them: it drops them if the reconnect does not resume the session.
    fn queued(&self) -> usize;
}

pub struct Session {
    requests: Box<dyn Requests>,
    tracker: Arc<Mutex<Tracker>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Session {
    /// Starts polling and waits for the first CONNACK: the session, and whether the server had one.
    pub async fn start(
        requests: Box<dyn Requests>,
        event_loop: impl EventLoop,
        reconnect: bool,
        timeout: Duration,
    ) -> Result<(Session, bool), String> {
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let (connected, first_connack) = oneshot::channel();
        let (stop, stopped) = oneshot::channel();
        let poller = Poller { event_loop, tracker: tracker.clone(), reconnect, connected: Some(connected) };
        let task = tokio::spawn(poller.run(stopped));
        let session = Session { requests, tracker, stop: Some(stop), task };
        match time::timeout(timeout, first_connack).await {
            Ok(Ok(Ok(session_present))) => Ok((session, session_present)),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Err("rumqttc's event loop ended before the CONNACK".into()),
            Err(_) => {
                session.close().await;
                Err("timeout".into())
            }
        }
    }

    /// False once the connection is over (lost without reconnect, or given up).
    pub fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }

    pub async fn publish(&self, params: &PublishParams, timeout: Duration) -> Reply {
        self.request(Kind::Publish { qos: params.qos }, |requests| requests.publish(params), timeout).await
    }

    pub async fn subscribe(&self, params: &SubscribeParams, timeout: Duration) -> Reply {
        self.request(Kind::Subscribe, |requests| requests.subscribe(params), timeout).await
    }

    pub async fn unsubscribe(&self, filter: &str, timeout: Duration) -> Reply {
        self.request(Kind::Unsubscribe, |requests| requests.unsubscribe(filter), timeout).await
    }

    /// A DISCONNECT, then the close: the poll task ends once it has written the DISCONNECT.
    pub async fn disconnect(mut self, timeout: Duration) -> Reply {
        if !self.is_alive() {
            return Err("not connected: the connection was lost".into());
        }
        self.requests.disconnect()?;
        if time::timeout(timeout, &mut self.task).await.is_err() {
            self.close().await;
            return Err("timeout".into());
        }
        Ok(Map::new())
    }

    /// Drops the connection without DISCONNECT; reconnecting ends with the poll task.
    pub async fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The task stops at its next await, which the stop signal interrupts.
        let _ = (&mut self.task).await;
    }

    async fn request(
        &self,
        kind: Kind,
        queue: impl FnOnce(&dyn Requests) -> Result<(), String>,
        timeout: Duration,
    ) -> Reply {
        if !self.is_alive() {
            return Err("not connected: the connection was lost".into());
        }
        let reply = {
            // Queued and expected under one lock, so the tracker's order is rumqttc's.
            let mut tracker = self.tracker.lock().expect("tracker lock");
            queue(self.requests.as_ref())?;
            tracker.expect(kind)
        };
        match time::timeout(timeout, reply).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err("the connection was closed before the command completed".into()),
            Err(_) => Err("timeout".into()),
        }
    }
}

struct Poller<L> {
    event_loop: L,
    tracker: Arc<Mutex<Tracker>>,
    reconnect: bool,
    /// Answers the connect command, at the first CONNACK or error.
    connected: Option<oneshot::Sender<Result<bool, String>>>,
}

impl<L: EventLoop> Poller<L> {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        // Since when the connection is lost, and how many unwritten requests rumqttc kept then.
        let mut lost: Option<(Instant, usize)> = None;
        loop {
            let polled = tokio::select! {
                _ = &mut stop => return,
                polled = self.event_loop.poll() => polled,
            };
            match polled {
                Ok(Progress::Connected { session_present }) => self.connected(session_present, lost.take()),
                Ok(Progress::DisconnectWritten) => return self.end("disconnected"),
                Ok(progress) => self.progress(progress),
                Err(error) => {
                    if !self.failed(error, &mut lost) {
                        return;
                    }
                    tokio::select! {
                        _ = &mut stop => return,
                        () = time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// A poll failed: answers the connect command, or reports the loss. True when rumqttc is to be
    /// polled again, to reconnect.
    fn failed(&mut self, error: String, lost: &mut Option<(Instant, usize)>) -> bool {
        if let Some(connected) = self.connected.take() {
            let _ = connected.send(Err(error));
            return false;
        }
        let since = match *lost {
            Some((since, _)) => since,
            None => self.lose(&error),
        };
        if !self.reconnect {
            self.end(&format!("connection lost: {error}"));
            return false;
        }
        if since.elapsed() > GIVE_UP_RECONNECTING {
            self.end(&format!("gave up reconnecting: {error}"));
            return false;
        }
        eprintln!("rumqttc driver: {error}; polling rumqttc again to reconnect");
        *lost = Some((since, self.event_loop.queued()));
        true
    }

    fn connected(&mut self, session_present: bool, lost: Option<(Instant, usize)>) {
        if let Some(connected) = self.connected.take() {
            let _ = connected.send(Ok(session_present));
        } else if let Some((_, queued)) = lost {
            if !session_present {
                self.tracker().session_not_resumed(queued);
            }
            output::event("reconnected", fields("session_present", session_present.into()));
        }
    }

    fn progress(&mut self, progress: Progress) {
        match progress {
            Progress::Written(written) => self.tracker().written(written),
            Progress::Acked(ack) => self.tracker().acked(ack),
            Progress::Message(message) => output::event("message", message),
            Progress::Connected { .. } | Progress::DisconnectWritten | Progress::Nothing => {}
        }
    }

    /// Reports the loss; returns when it happened.
    fn lose(&mut self, error: &str) -> Instant {
        output::event("connection_lost", fields("error", error.into()));
        self.tracker().connection_lost(error);
        Instant::now()
    }

    fn end(&mut self, why: &str) {
        self.tracker().fail_all(why);
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().expect("tracker lock")
    }
}

fn fields(name: &str, value: Value) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert(name.into(), value);
    fields
}
