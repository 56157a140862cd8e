//! Whether each configured interface still runs the limiter, and when to attach it
//! again (pure). An interface deleted and created again under its name (a driver reset,
//! `ip link del` / `add`) is a new device: the link the daemon made went with the old
//! one, and frames pass unmetered until the program is attached again. The daemon feeds
//! this state what netlink says (the name's index now, the indexes deleted) and attaches
//! when it says so: at most once per [`MIN_SPACING`] per interface however often the
//! device flaps, and after a failed attempt only once the back-off (doubling up to
//! [`MAX_BACKOFF`]) has passed.

use std::time::{Duration, Instant};

/// The least time between two attach attempts on one interface.
pub const MIN_SPACING: Duration = Duration::from_secs(1);
/// The longest wait after failed attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What the daemon is to do for one interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the program runs there, or the interface is gone, or the next attempt
    /// is not due yet.
    Wait,
    /// The device the program ran on is gone: say so (once).
    Lost,
    /// Attach to the device that now has the name.
    Attach { ifindex: u32 },
}

/// One configured interface.
#[derive(Clone, Debug)]
pub struct LinkWatch {
    /// The device the program runs on; `None` while it runs nowhere.
    ifindex: Option<u32>,
    /// Its rtnetlink kind ("veth", "bond"; `None`: a physical device) when attached.
    pub kind: Option<String>,
    /// Times the program was attached again (since the daemon started).
    pub reattaches: u64,
    /// Attempts that failed (since the daemon started).
    pub failures: u64,
    /// Why the last attempt failed, until one succeeds.
    pub last_error: Option<String>,
    /// No attempt before this.
    next_try: Option<Instant>,
    backoff: Duration,
}

impl LinkWatch {
    /// An interface the program was just attached to (at start).
    pub fn attached(ifindex: u32, kind: Option<String>) -> LinkWatch {
        LinkWatch {
            ifindex: Some(ifindex),
            kind,
            reattaches: 0,
            failures: 0,
            last_error: None,
            next_try: None,
            backoff: MIN_SPACING,
        }
    }

    /// Whether the program runs on the device that has the name now.
    pub fn is_attached(&self) -> bool {
        self.ifindex.is_some()
    }

    /// The device `ifindex` was deleted (netlink's RTM_DELLINK): if it was this one,
    /// the program runs nowhere now. Returns whether it was.
    pub fn deleted(&mut self, ifindex: u32) -> bool {
        if self.ifindex == Some(ifindex) {
            self.ifindex = None;
            return true;
        }
        false
    }

    /// Decides, given the index the name has now (`None`: no such device).
    pub fn observe(&mut self, current: Option<u32>, now: Instant) -> Action {
        match (self.ifindex, current) {
            (Some(ours), Some(now_there)) if ours == now_there => Action::Wait,
            (Some(_), None) => {
                self.ifindex = None;
                Action::Lost
            }
            (None, None) => Action::Wait,
            // A new device under the name (a different index, or any device after the
            // one the program ran on was deleted).
            (Some(_), Some(new)) | (None, Some(new)) => {
                self.ifindex = None;
                if self.next_try.is_some_and(|t| now < t) {
                    Action::Wait
                } else {
                    Action::Attach { ifindex: new }
                }
            }
        }
    }

    /// The attach to `ifindex` worked.
    pub fn succeeded(&mut self, ifindex: u32, kind: Option<String>, now: Instant) {
        self.ifindex = Some(ifindex);
        self.kind = kind;
        self.reattaches += 1;
        self.last_error = None;
        self.backoff = MIN_SPACING;
        self.next_try = Some(now + MIN_SPACING);
    }

    /// The attach failed with `error`: the next attempt waits, longer each time.
    /// Returns the wait.
    pub fn failed(&mut self, error: String, now: Instant) -> Duration {
        self.failures += 1;
        self.last_error = Some(error);
        let wait = self.backoff;
        self.next_try = Some(now + wait);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_device_under_the_name_is_attached_and_counted() {
        let t = Instant::now();
        let mut w = LinkWatch::attached(5, Some("veth".into()));
        assert_eq!(w.observe(Some(5), t), Action::Wait);
        assert_eq!(w.observe(None, t), Action::Lost);
        assert!(!w.is_attached());
        assert_eq!(w.observe(None, t), Action::Wait, "Lost is said once");
        assert_eq!(w.observe(Some(9), t), Action::Attach { ifindex: 9 });
        w.succeeded(9, Some("veth".into()), t);
        assert!(w.is_attached());
        assert_eq!(w.reattaches, 1);
        assert_eq!(w.observe(Some(9), t), Action::Wait);
    }

    #[test]
    fn a_device_deleted_and_made_again_with_the_same_index_is_attached() {
        let t = Instant::now();
        let mut w = LinkWatch::attached(5, None);
        assert!(!w.deleted(6), "another device");
        assert!(w.deleted(5));
        assert_eq!(w.observe(Some(5), t), Action::Attach { ifindex: 5 });
    }

    #[test]
    fn flapping_gets_one_attempt_a_second_and_failures_back_off() {
        let t = Instant::now();
        let mut w = LinkWatch::attached(1, None);
        let mut attempts = 0;
        // The device flaps every 10 ms for 3 s, each time with a new index.
        for i in 0..300u32 {
            let now = t + Duration::from_millis(10 * u64::from(i));
            if let Action::Attach { ifindex } = w.observe(Some(100 + i), now) {
                attempts += 1;
                w.succeeded(ifindex, None, now);
            }
        }
        assert!(attempts <= 3, "{attempts} attempts in 3 s");
        // Failures: 1 s, 2 s, 4 s ... up to 30 s.
        let mut w = LinkWatch::attached(1, None);
        let mut now = t;
        let mut waits = Vec::new();
        for _ in 0..7 {
            assert!(matches!(w.observe(Some(2), now), Action::Attach { .. }));
            let wait = w.failed("refused".into(), now);
            assert_eq!(w.observe(Some(2), now + wait / 2), Action::Wait);
            waits.push(wait.as_secs());
            now += wait;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(w.failures, 7);
        w.succeeded(2, None, now);
        assert_eq!(w.last_error, None);
        assert_eq!(
            w.failed("again".into(), now).as_secs(),
            1,
            "a success resets the back-off"
        );
    }
}
