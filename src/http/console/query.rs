//! The console's addresses: where it lives, the query strings and forms
//! it reads, and the links its pages make.

/// Where the console lives on the HTTP port.
pub const PREFIX: &str = "/console/";

/// The decoded query string of a request.
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(text: &[u8]) -> Query {
        Query(form_urlencoded::parse(text).into_owned().collect())
    }

    /// The value of `name`, empty when absent.
    pub(super) fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// `path?name=value&...`, the values encoded.
pub(super) fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        query.append_pair(name, value);
    }
    format!("{PREFIX}{path}?{}", query.finish())
}
