//! Parses Prometheus text exposition (format 0.0.4) into families of plain samples.
//! Owns only text → values; it knows nothing of which metrics matter or how they add up.

use prometheus_text::Kind;
use std::collections::BTreeMap;

/// One sample line: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub suffix: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The `# TYPE` the text declares; `None`: `untyped` or no `# TYPE` line.
    pub kind: Option<Kind>,
    pub samples: Vec<Sample>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: &'static str },
}

/// Families by name. Summary/histogram sample lines (`_sum`, `_count`, `_bucket`) are filed
/// under their family with `suffix` set.
pub fn parse(text: &str) -> Result<BTreeMap<String, Family>, ParseError> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |reason| ParseError::Line {
            line: i + 1,
            reason,
        };
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.split_whitespace();
            if words.next() == Some("TYPE") {
                let name = words.next().ok_or(err("TYPE without a name"))?;
                let kind = match words.next() {
                    Some("untyped") => None,
                    word => Some(
                        word.and_then(Kind::from_keyword)
                            .ok_or(err("unknown TYPE"))?,
                    ),
                };
                families
                    .entry(name.to_string())
                    .or_insert(Family {
                        kind,
                        samples: Vec::new(),
                    })
                    .kind = kind;
            }
            continue;
        }
        let (name, labels, rest) = split_sample(line).ok_or(err("malformed sample"))?;
        let value_text = rest
            .split_whitespace()
            .next()
            .ok_or(err("sample without value"))?;
        let value = parse_value(value_text).ok_or(err("bad sample value"))?;
        let (family, suffix) = family_of(&families, name);
        families
            .entry(family.to_string())
            .or_insert(Family {
                kind: None,
                samples: Vec::new(),
            })
            .samples
            .push(Sample {
                suffix: suffix.to_string(),
                labels,
                value,
            });
    }
    Ok(families)
}

fn family_of<'a>(families: &BTreeMap<String, Family>, name: &'a str) -> (&'a str, &'a str) {
    for suffix in ["_sum", "_count", "_bucket"] {
        if let Some(base) = name.strip_suffix(suffix)
            && families
                .get(base)
                .is_some_and(|f| matches!(f.kind, Some(Kind::Summary | Kind::Histogram)))
        {
            return (base, suffix);
        }
    }
    (name, "")
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        t => t.parse().ok(),
    }
}

type Split<'a> = (&'a str, BTreeMap<String, String>, &'a str);

/// `name{k="v",...} value [ts]` → name, labels, the text after the labels.
fn split_sample(line: &str) -> Option<Split<'_>> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut labels = BTreeMap::new();
    let Some(mut body) = line[name_end..].strip_prefix('{') else {
        return Some((name, labels, &line[name_end..]));
    };
    loop {
        body = body.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if let Some(rest) = body.strip_prefix('}') {
            return Some((name, labels, rest));
        }
        let eq = body.find('=')?;
        let key = body[..eq].trim().to_string();
        let quoted = body[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (j, ch) in quoted.char_indices() {
            match (escaped, ch) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, ch) => {
                    value.push(ch);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(j);
                    break;
                }
                (false, ch) => value.push(ch),
            }
        }
        labels.insert(key, value);
        body = &quoted[end? + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gauges_counters_labels_and_summaries() {
        let text = "# HELP awscni_eni_max x\n# TYPE awscni_eni_max gauge\nawscni_eni_max 4\n\
# TYPE awscni_add_ip_req_count counter\n\
awscni_add_ip_req_count 7\n\
# TYPE awscni_aws_api_latency_ms summary\n\
awscni_aws_api_latency_ms{api=\"AssignPrivateIpAddresses\",error=\"false\",quantile=\"0.99\"} 120.5\n\
awscni_aws_api_latency_ms_sum{api=\"AssignPrivateIpAddresses\",error=\"false\"} 300\n\
awscni_assigned_ip_per_cidr{cidr=\"10.0.0.5/32\"} 1\n";
        let f = parse(text).unwrap();
        assert_eq!(f["awscni_eni_max"].kind, Some(Kind::Gauge));
        assert_eq!(f["awscni_eni_max"].samples[0].value, 4.0);
        assert_eq!(f["awscni_add_ip_req_count"].kind, Some(Kind::Counter));
        let lat = &f["awscni_aws_api_latency_ms"];
        assert_eq!(lat.kind, Some(Kind::Summary));
        assert_eq!(lat.samples.len(), 2);
        assert_eq!(lat.samples[0].labels["quantile"], "0.99");
        assert_eq!(lat.samples[1].suffix, "_sum");
        assert_eq!(
            f["awscni_assigned_ip_per_cidr"].samples[0].labels["cidr"],
            "10.0.0.5/32"
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert_eq!(
            parse("awscni_eni_max four\n"),
            Err(ParseError::Line {
                line: 1,
                reason: "bad sample value"
            })
        );
    }
}
