//! The plugin-side error type and its conversion to and from the boundary's [`RError`].

use std::fmt;

use abi_stable::std_types::{ROption, RString};

use crate::abi::RError;

/// A result whose error is the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error with a stable code, a message, an optional fix and optional structured data.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    /// A stable machine-readable code, e.g. `FS_SANDBOX_DENIED`.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
    /// Structured details (a JSON object), if any.
    pub data: Option<serde_json::Value>,
}

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Error {
            code: code.into(),
            message: message.into(),
            help: None,
            data: None,
        }
    }

    /// Adds a fix.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Appends the error that caused this one, and its own sources, to the message
    /// (`message: cause: cause of cause`), so the host shows the whole chain. The chain is
    /// plain text: nothing but data crosses the plugin boundary.
    pub fn with_source(mut self, source: &(dyn std::error::Error + 'static)) -> Self {
        let mut next = Some(source);
        while let Some(e) = next {
            self.message.push_str(": ");
            self.message.push_str(&e.to_string());
            next = e.source();
        }
        self
    }

    /// Adds structured details.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    /// An `INVALID_ARGUMENT` error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(codes::INVALID_ARGUMENT, message)
    }

    /// An `INTERNAL` error.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(codes::INTERNAL, message)
    }
}

/// A runtime error code (the `code` of an [`Error`]) and what it means, as
/// `cordis check --explain` shows it. [`error_codes!`](crate::error_codes) declares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode {
    /// The stable name, e.g. `FS_SANDBOX_DENIED`.
    pub name: &'static str,
    /// What it means, on one line.
    pub explanation: &'static str,
}

/// Declares error codes: for each `/// what it means` and `NAME;`, a
/// `pub const NAME: &str = "NAME"` documented by that text, and `ALL`, every code of the
/// invocation as an [`ErrorCode`] whose explanation is the doc text on one line. An
/// interface crate declares its codes in its `codes` module with it, and the `cordis`
/// binary lists every such `ALL` for `cordis check --explain`.
///
/// ```
/// pub mod codes {
///     cordis_sdk::error_codes! {
///         /// The clock has not been set.
///         CLOCK_UNSET;
///         /// The time asked for is before the epoch.
///         CLOCK_BEFORE_EPOCH;
///     }
/// }
/// assert_eq!(codes::CLOCK_UNSET, "CLOCK_UNSET");
/// assert_eq!(codes::ALL[1].explanation, "The time asked for is before the epoch.");
/// ```
#[macro_export]
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])+ $name:ident;)*) => {
        $(
            $(#[doc = $doc])+
            pub const $name: &str = stringify!($name);
        )*
        /// Every code of this module, with what it means.
        pub const ALL: &[$crate::ErrorCode] = &[$($crate::ErrorCode {
            name: $name,
            explanation: concat!($($doc),+).trim_ascii(),
        }),*];
    };
}

/// Error codes the SDK itself produces.
pub mod codes {
    error_codes! {
        /// A plugin panicked; the panic was caught at the boundary.
        PANIC;
        /// Arguments or config did not match what was expected.
        INVALID_ARGUMENT;
        /// A method the service does not have.
        UNKNOWN_METHOD;
        /// A consumer asked for an interface the provider does not implement.
        INTERFACE_MISMATCH;
        /// A required service is not composed.
        MISSING_SERVICE;
        /// Anything else: an unexpected failure in a plugin or the host.
        INTERNAL;
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.message, self.code)?;
        if let Some(help) = &self.help {
            write!(f, " (help: {help})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<Error> for RError {
    fn from(e: Error) -> Self {
        RError {
            code: e.code.into(),
            message: e.message.into(),
            help: e.help.map(RString::from).into(),
            data: e.data.map(|d| d.to_string()).unwrap_or_default().into(),
        }
    }
}

impl From<RError> for Error {
    fn from(e: RError) -> Self {
        Error {
            code: e.code.into(),
            message: e.message.into(),
            help: match e.help {
                ROption::RSome(h) => Some(h.into()),
                ROption::RNone => None,
            },
            data: if e.data.is_empty() {
                None
            } else {
                serde_json::from_str(&e.data).ok()
            },
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::invalid(e.to_string())
    }
}

/// Turns a caught panic payload into an error naming where it happened.
pub(crate) fn from_panic(what: &str, payload: Box<dyn std::any::Any + Send>) -> Error {
    let detail = panic_text(&*payload);
    Error::new(codes::PANIC, format!("{what} panicked: {detail}"))
        .with_help("this is a bug in the plugin; its panic was caught at the plugin boundary")
}

/// The message of a panic payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cannot read the word list")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    mod declared {
        error_codes! {
            /// The first line of a longer
            /// explanation.
            LONG_ONE;
            /// Short.
            SHORT;
        }
    }

    #[test]
    fn declared_codes_are_their_names_and_explained_on_one_line() {
        assert_eq!((declared::LONG_ONE, declared::SHORT), ("LONG_ONE", "SHORT"));
        assert_eq!(
            declared::ALL,
            [
                ErrorCode {
                    name: "LONG_ONE",
                    explanation: "The first line of a longer explanation.",
                },
                ErrorCode {
                    name: "SHORT",
                    explanation: "Short.",
                },
            ]
        );
        let names: Vec<&str> = codes::ALL.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                codes::PANIC,
                codes::INVALID_ARGUMENT,
                codes::UNKNOWN_METHOD,
                codes::INTERFACE_MISMATCH,
                codes::MISSING_SERVICE,
                codes::INTERNAL
            ]
        );
    }

    #[test]
    fn the_whole_cause_chain_is_kept() {
        let cause = Outer(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "words.txt is missing",
        ));
        let e = Error::new("START", "cannot start").with_source(&cause);
        assert_eq!(
            e.message,
            "cannot start: cannot read the word list: words.txt is missing"
        );
    }
}
