//! The `greeter` interface: a seam crate that a provider and its consumers both depend on,
//! so they agree on method names, argument shapes and the interface version.

cordis_sdk::interface! {
    /// Greets people.
    pub trait Greeter as GreeterClient ("example.greeter", 1) {
        /// A greeting for `name`.
        fn greet(&self, name: String) -> String;
    }
}
