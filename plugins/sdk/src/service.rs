//! Typed services over the JSON boundary: the consumer side ([`Service`], [`Interface`]) and
//! the provider side ([`serve`]). Seam crates use [`crate::interface!`] to generate both from
//! one trait, so provider and consumer cannot disagree on names or shapes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RArc, RResult, RStr, RString},
};
use serde::{de::DeserializeOwned, Serialize};

use crate::abi::{RError, ServiceBox, ServiceDecl, ServiceObj, ServiceObj_TO};
use crate::error::{codes, from_panic, Error, Result};

/// An interface identity: what a seam crate's client type declares.
pub trait Interface: Sized {
    /// The interface identity, e.g. `dsh.fs`.
    const ID: &'static str;
    /// The interface version; bump it on any incompatible change.
    const VERSION: u32;
    /// Wraps a raw service handle whose identity has been checked.
    fn from_service(service: Service) -> Self;
}

/// A consumer's handle to a service: calls cross the ABI as JSON.
#[derive(Clone)]
pub struct Service {
    name: String,
    handle: ServiceBox,
}

/// Why a service cannot be used as an interface: the one compatibility rule (identity and
/// version must match exactly), applied by the SDK when a plugin injects a service, by the
/// host when a plugin provides one and when it plans a composition, and by `cordis-test`
/// when it checks a stand-in, all with the one message of [`InterfaceMismatch::explain`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceMismatch {
    /// The registry name of the service.
    pub service: String,
    /// The interface identity and version wanted.
    pub wanted: (String, u32),
    /// The interface identity and version found.
    pub found: (String, u32),
}

impl InterfaceMismatch {
    /// `Err` unless `found` is exactly `wanted` (identity and version).
    pub fn check(
        service: &str,
        wanted: (&str, u32),
        found: (&str, u32),
    ) -> std::result::Result<(), InterfaceMismatch> {
        if wanted == found {
            return Ok(());
        }
        Err(InterfaceMismatch {
            service: service.to_string(),
            wanted: (wanted.0.to_string(), wanted.1),
            found: (found.0.to_string(), found.1),
        })
    }

    /// The message: `consumer` (e.g. "entry `a`") injects the service, `provider` (e.g.
    /// "entry `b`", "the stand-in") provides it.
    pub fn explain(&self, consumer: &str, provider: &str) -> String {
        format!(
            "{consumer} injects `{}` as {} v{}, but {provider} provides it as {} v{}; interface versions must match exactly: rebuild one of them against the other's version of the seam crate",
            self.service, self.wanted.0, self.wanted.1, self.found.0, self.found.1
        )
    }

    /// What to do about it.
    pub fn help(&self) -> String {
        format!(
            "rebuild both sides against the same version of the seam crate that defines `{}`",
            self.wanted.0
        )
    }
}

impl Service {
    /// Wraps `handle`, checking it implements `I` (identity and version).
    pub fn checked<I: Interface>(name: &str, handle: ServiceBox) -> Result<I> {
        let actual = handle.interface();
        if let Err(mismatch) = InterfaceMismatch::check(
            name,
            (I::ID, I::VERSION),
            (actual.interface.as_str(), actual.version),
        ) {
            return Err(Error::new(
                codes::INTERFACE_MISMATCH,
                mismatch.explain("this plugin", "the composition"),
            )
            .with_help(mismatch.help()));
        }
        Ok(I::from_service(Service {
            name: name.to_string(),
            handle,
        }))
    }

    /// The registry name this handle was injected under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Calls `method` with `args`, decoding the JSON result.
    pub fn call<A: Serialize, R: DeserializeOwned>(&self, method: &str, args: &A) -> Result<R> {
        let args = serde_json::to_string(args)?;
        let raw = self.call_raw(method, &args)?;
        serde_json::from_str(&raw).map_err(|e| {
            Error::internal(format!(
                "service `{}` returned a malformed result for `{method}`: {e}",
                self.name
            ))
        })
    }

    /// Calls `method` with raw JSON `args`, returning raw JSON.
    pub fn call_raw(&self, method: &str, args: &str) -> Result<String> {
        match self.handle.call(RStr::from(method), RStr::from(args)) {
            RResult::ROk(s) => Ok(s.into()),
            RResult::RErr(e) => Err(e.into()),
        }
    }

    /// The raw handle, for passing the service on.
    pub fn handle(&self) -> &ServiceBox {
        &self.handle
    }
}

type Handler = dyn Fn(&str, &str) -> Result<String> + Send + Sync;

#[derive(Clone)]
struct Dispatcher {
    decl: ServiceDecl,
    handler: Arc<Handler>,
}

impl ServiceObj for Dispatcher {
    fn interface(&self) -> ServiceDecl {
        self.decl.clone()
    }

    fn call(&self, method: RStr<'_>, args: RStr<'_>) -> RResult<RString, RError> {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            (self.handler)(method.as_str(), args.as_str())
        }));
        match outcome {
            Ok(Ok(s)) => RResult::ROk(s.into()),
            Ok(Err(e)) => RResult::RErr(e.into()),
            Err(payload) => RResult::RErr(
                from_panic(&format!("{}.{}", self.decl.interface, method), payload).into(),
            ),
        }
    }
}

/// Makes a service object from a raw JSON handler. Panics inside `handler` are caught and
/// returned as `PANIC` errors. Seam crates call this through [`crate::interface!`].
pub fn serve<F>(interface: &str, version: u32, handler: F) -> ServiceBox
where
    F: Fn(&str, &str) -> Result<String> + Send + Sync + 'static,
{
    ServiceObj_TO::from_ptr(
        RArc::new(Dispatcher {
            decl: ServiceDecl {
                name: RString::new(),
                interface: interface.into(),
                version,
            },
            handler: Arc::new(handler),
        }),
        TD_Opaque,
    )
}

/// Decodes JSON `args` for `method`, naming the method in the error.
pub fn decode_args<T: DeserializeOwned>(method: &str, args: &str) -> Result<T> {
    serde_json::from_str(args)
        .map_err(|e| Error::invalid(format!("bad arguments for `{method}`: {e}")))
}

/// Encodes a method's result as JSON.
pub fn encode_result<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::internal(format!("cannot encode result: {e}")))
}

/// Serializes a long text field as a JSON string, escaped with SIMD instructions: the same
/// JSON serde gives, faster for the kilobytes of file or command output a method returns
/// (serde's escaping looks at one byte at a time). For `#[serde(serialize_with =
/// "cordis_sdk::json_text")]`; a serializer other than `serde_json`'s gets a plain string.
pub fn json_text<S: serde::Serializer>(
    text: &str,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    const SHORT: usize = 64;
    if text.len() < SHORT
        || !std::any::type_name::<S>().contains("serde_json::")
        || !raw_text_works()
    {
        return serializer.serialize_str(text);
    }
    RawText(&json_escape_simd::escape(text)).serialize(serializer)
}

/// The name under which `serde_json` writes a raw value verbatim (what its `RawValue`
/// serializes as). `RawValue::from_string` would parse the text again to check it; the text
/// escaped here is JSON by construction.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Already escaped JSON, written as it is.
pub(crate) struct RawText<'a>(pub(crate) &'a str);

impl Serialize for RawText<'_> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut raw = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
        raw.serialize_field(RAW_VALUE_TOKEN, self.0)?;
        raw.end()
    }
}

/// Whether this `serde_json` writes [`RawText`] verbatim: checked once, so a version that
/// names its raw values differently gets plain strings rather than wrong JSON.
pub(crate) fn raw_text_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let escaped = json_escape_simd::escape("a\n\"b\"");
        serde_json::to_string(&RawText(&escaped)).ok().as_deref() == Some(r#""a\n\"b\"""#)
            && serde_json::to_value(RawText(&escaped)).ok() == Some("a\n\"b\"".into())
    })
}

/// Generates a typed service interface: a trait for providers, a client type for consumers
/// that implements the same trait over the ABI, and `Client::serve(provider)`.
///
/// Every method takes `&self` and one serde argument and returns `Result<T>`.
///
/// ```
/// use cordis_sdk::prelude::*;
///
/// cordis_sdk::interface! {
///     /// Says hello.
///     pub trait Greeter as GreeterClient ("example.greeter", 1) {
///         /// Greets `name`.
///         fn greet(&self, name: String) -> String;
///     }
/// }
///
/// struct English;
/// impl Greeter for English {
///     fn greet(&self, name: String) -> Result<String> {
///         Ok(format!("hello, {name}"))
///     }
/// }
///
/// let handle = GreeterClient::serve(English);
/// let client: GreeterClient = Service::checked("greeter", handle).unwrap();
/// assert_eq!(client.greet("Ada".into()).unwrap(), "hello, Ada");
/// ```
#[macro_export]
macro_rules! interface {
    (
        $(#[$meta:meta])*
        $vis:vis trait $trait_name:ident as $client:ident ($id:literal, $version:literal) {
            $(
                $(#[$mmeta:meta])*
                fn $method:ident(&self, $arg:ident : $arg_ty:ty) -> $ret:ty;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis trait $trait_name: Send + Sync + 'static {
            $(
                $(#[$mmeta])*
                fn $method(&self, $arg: $arg_ty) -> $crate::Result<$ret>;
            )*
        }

        #[doc = concat!("The consumer side of [`", stringify!($trait_name), "`], calling a provider across the ABI.")]
        #[derive(Clone)]
        $vis struct $client {
            service: $crate::Service,
        }

        impl $crate::Interface for $client {
            const ID: &'static str = $id;
            const VERSION: u32 = $version;
            fn from_service(service: $crate::Service) -> Self {
                $client { service }
            }
        }

        impl $client {
            /// Wraps a provider as a service object the host can register.
            pub fn serve<T: $trait_name>(provider: T) -> $crate::abi::ServiceBox {
                let provider = ::std::sync::Arc::new(provider);
                $crate::serve($id, $version, move |method: &str, args: &str| -> $crate::Result<String> {
                    match method {
                        $(
                            stringify!($method) => {
                                let $arg: $arg_ty = $crate::decode_args(method, args)?;
                                $crate::encode_result(&provider.$method($arg)?)
                            }
                        )*
                        other => Err($crate::Error::new(
                            $crate::codes::UNKNOWN_METHOD,
                            format!("interface {} v{} has no method `{}`", $id, $version, other),
                        )),
                    }
                })
            }

            /// The raw service handle.
            pub fn service(&self) -> &$crate::Service {
                &self.service
            }
        }

        impl $trait_name for $client {
            $(
                fn $method(&self, $arg: $arg_ty) -> $crate::Result<$ret> {
                    self.service.call(stringify!($method), &$arg)
                }
            )*
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::interface! {
        trait Echo as EchoClient ("test.echo", 3) {
            fn echo(&self, text: String) -> String;
            fn boom(&self, unit: ()) -> ();
        }
    }

    struct Impl;
    impl Echo for Impl {
        fn echo(&self, text: String) -> Result<String> {
            Ok(text)
        }
        fn boom(&self, _unit: ()) -> Result<()> {
            panic!("kaboom")
        }
    }

    #[test]
    fn round_trip_and_panic_guard() {
        let client: EchoClient = Service::checked("echo", EchoClient::serve(Impl)).unwrap();
        assert_eq!(client.echo("hi".into()).unwrap(), "hi");
        let err = client.boom(()).unwrap_err();
        assert_eq!(err.code, codes::PANIC);
        assert!(err.message.contains("kaboom"), "{}", err.message);
        let err = client.service().call_raw("nope", "null").unwrap_err();
        assert_eq!(err.code, codes::UNKNOWN_METHOD);
        let err = client.service().call_raw("echo", "42").unwrap_err();
        assert_eq!(err.code, codes::INVALID_ARGUMENT);
    }

    #[test]
    fn json_text_is_the_json_serde_gives() {
        #[derive(Serialize)]
        struct Page<'a> {
            #[serde(serialize_with = "json_text")]
            text: &'a str,
        }
        // The fast path is taken with this `serde_json`.
        assert!(raw_text_works());
        let every_ascii: String = (0u8..0x80).map(char::from).collect();
        let mut texts = vec![
            String::new(),
            "short \"quoted\"\n".to_string(),
            every_ascii.repeat(3),
            "0123456789abcdef".repeat(256),
            "line\twith tab, é, 日本語, \u{1F600} and \u{7f}\r\n".repeat(40),
        ];
        // Each ASCII byte alone in a long text, at every offset of a SIMD block.
        for b in 0u8..0x80 {
            for at in [0, 1, 15, 16, 31, 32, 63, 64, 65] {
                let mut t = "x".repeat(80);
                t.insert(at, char::from(b));
                texts.push(t);
            }
        }
        for text in &texts {
            let page = Page { text };
            let expected = serde_json::json!({ "text": text }).to_string();
            assert_eq!(serde_json::to_string(&page).unwrap(), expected, "{text:?}");
            assert_eq!(
                serde_json::to_value(&page).unwrap(),
                serde_json::json!({ "text": text })
            );
        }
    }

    #[test]
    fn interface_mismatch_is_an_error() {
        let handle = serve("test.echo", 2, |_, _| Ok("null".into()));
        let err = match Service::checked::<EchoClient>("echo", handle) {
            Err(e) => e,
            Ok(_) => panic!("a v2 provider must not satisfy a v3 consumer"),
        };
        assert_eq!(err.code, codes::INTERFACE_MISMATCH);
        assert!(err.message.contains("v2") && err.message.contains("v3"));
    }
}
