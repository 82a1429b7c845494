//! The logging bridge: a plugin library has its own copy of `tracing-core`, so its events
//! would never reach the host's subscriber. The SDK installs a tiny subscriber in the plugin
//! that forwards every enabled event to the host's logger through the ABI.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::{Once, RwLock};

use abi_stable::std_types::RStr;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::abi::LoggerBox;

/// The logger of the entry applied last: where events go from threads the plugin spawned
/// itself.
static LOGGER: RwLock<Option<LoggerBox>> = RwLock::new(None);
static INSTALL: Once = Once::new();

thread_local! {
    /// The logger of the entry whose code this thread is running (set while the host calls
    /// into an instance, a service or a tool), so that two entries of one library log under
    /// their own ids. A raw pointer: no destructor is registered, which would pin the
    /// library in the process.
    static CURRENT: Cell<*const LoggerBox> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with `logger` as this thread's destination for log events (restored after).
pub(crate) fn with_logger<T>(logger: &LoggerBox, f: impl FnOnce() -> T) -> T {
    struct Restore(*const LoggerBox);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(logger)));
    f()
}

/// Calls `f` with the logger for an event on this thread.
fn with_current<T>(f: impl FnOnce(Option<&LoggerBox>) -> T) -> T {
    let current = CURRENT.with(Cell::get);
    if !current.is_null() {
        // SAFETY: set only by `with_logger`, whose borrow outlives every use on this thread
        // (the pointer is restored before it returns).
        return f(Some(unsafe { &*current }));
    }
    let guard = LOGGER.read().unwrap_or_else(|e| e.into_inner());
    f(guard.as_ref())
}

/// Routes this library's `tracing` events to `logger` (the host tags them with the plugin).
pub(crate) fn install(logger: LoggerBox) {
    *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = Some(logger);
    INSTALL.call_once(|| {
        // Fails only if the plugin installed its own global subscriber: then it keeps it.
        let _ = tracing::subscriber::set_global_default(Bridge);
        // This library has its own std, so its own panic hook: report panics through the
        // host's log (the panic itself is caught at the boundary and becomes an error).
        std::panic::set_hook(Box::new(|info| {
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            tracing::error!(
                "plugin panicked{at}: {}",
                crate::error::panic_text(info.payload())
            );
        }));
    });
}

pub(crate) fn level_number(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

struct Bridge;

impl Subscriber for Bridge {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        with_current(|logger| logger.is_some_and(|l| l.enabled(level_number(metadata.level()))))
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        with_current(|logger| {
            let Some(logger) = logger else { return };
            let mut text = MessageText::default();
            event.record(&mut text);
            let meta = event.metadata();
            logger.log(
                level_number(meta.level()),
                RStr::from(meta.target()),
                RStr::from(text.0.as_str()),
            );
        });
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// `message` first, then `key=value` for every other field.
#[derive(Default)]
struct MessageText(String);

impl Visit for MessageText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}");
            if !rest.is_empty() {
                self.0.push(' ');
                self.0.push_str(&rest);
            }
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }
}
