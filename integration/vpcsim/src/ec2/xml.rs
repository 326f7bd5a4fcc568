//! A small XML document builder on quick-xml (escaping included) with EC2's conventions:
//! lowerCamel element names, lists as `<name><item>...</item></name>`, the 2016-11-15
//! namespace on the root. Must not know the state model.

use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use std::fmt::Display;

/// EC2 API namespace used on every response root.
pub const NAMESPACE: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// An XML document being written.
pub struct Xml {
    w: Writer<Vec<u8>>,
}

impl std::fmt::Debug for Xml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xml")
            .field("len", &self.w.get_ref().len())
            .finish()
    }
}

impl Xml {
    /// A document whose root is `<{root} xmlns=...>` followed by `<requestId>`.
    pub fn response(root: &str, request_id: &str) -> Self {
        let mut x = Self::bare();
        let mut start = BytesStart::new(root);
        start.push_attribute(("xmlns", NAMESPACE));
        x.event(Event::Start(start));
        x.text("requestId", request_id);
        x
    }

    /// A document with only the XML declaration.
    pub fn bare() -> Self {
        let mut x = Self {
            w: Writer::new(Vec::new()),
        };
        x.event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
        x
    }

    fn event(&mut self, e: Event<'_>) {
        // Writing into a Vec cannot fail.
        let _ = self.w.write_event(e);
    }

    /// `<name>`
    pub fn open(&mut self, name: &str) {
        self.event(Event::Start(BytesStart::new(name)));
    }

    /// `</name>`
    pub fn close(&mut self, name: &str) {
        self.event(Event::End(BytesEnd::new(name)));
    }

    /// `<name>value</name>`
    pub fn text(&mut self, name: &str, value: impl Display) {
        self.open(name);
        let s = value.to_string();
        self.event(Event::Text(BytesText::new(&s)));
        self.close(name);
    }

    /// `<name>value</name>` when `value` is set.
    pub fn opt(&mut self, name: &str, value: Option<impl Display>) {
        if let Some(v) = value {
            self.text(name, v);
        }
    }

    /// `<name>` then `f` then `</name>`.
    pub fn nest(&mut self, name: &str, f: impl FnOnce(&mut Self)) {
        self.open(name);
        f(self);
        self.close(name);
    }

    /// `<name><item>..</item>...</name>`, each item written by `f`.
    pub fn list<T>(
        &mut self,
        name: &str,
        items: impl IntoIterator<Item = T>,
        mut f: impl FnMut(&mut Self, T),
    ) {
        self.open(name);
        for item in items {
            self.open("item");
            f(self, item);
            self.close("item");
        }
        self.close(name);
    }

    /// `<name><item>v</item>...</name>` for plain values.
    pub fn values<T: Display>(&mut self, name: &str, items: impl IntoIterator<Item = T>) {
        self.open(name);
        for item in items {
            self.text("item", item);
        }
        self.close(name);
    }

    /// Close the root and return the bytes.
    pub fn finish(mut self, root: &str) -> Vec<u8> {
        self.close(root);
        self.w.into_inner()
    }

    /// Return the bytes as written (no root to close).
    pub fn into_bytes(self) -> Vec<u8> {
        self.w.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_nests() {
        let mut x = Xml::response("FooResponse", "r-1");
        x.text("description", "a<b&c");
        x.values("set", ["x", "y"]);
        let s = String::from_utf8(x.finish("FooResponse")).unwrap();
        assert!(s.contains("<description>a&lt;b&amp;c</description>"), "{s}");
        assert!(s.contains("<set><item>x</item><item>y</item></set>"), "{s}");
        assert!(
            s.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?><FooResponse xmlns="),
            "{s}"
        );
    }
}
