//! The apiserver's own Prometheus metrics, read as a benchmark needs them: a snapshot of the
//! samples, and sums over the labels a question picks (requests by verb and resource, watches
//! open, the process's CPU seconds and memory).

use std::collections::BTreeMap;

/// One sample: its metric name, labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Every sample of a text exposition; comments and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter(|line| !line.starts_with('#')).filter_map(sample).collect()
}

fn sample(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        None => (series, BTreeMap::new()),
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// `a="x",b="y"` (values may hold escaped quotes and commas).
fn labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '\\' => value.push(chars.next()?.1),
                '"' => break index,
                c => value.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// The sum of metric `name` over the samples whose labels hold every pair of `having`.
pub fn sum(samples: &[Sample], name: &str, having: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && having.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// Metric `name` summed by the values of labels `keys` (joined with a space).
pub fn by(samples: &[Sample], name: &str, keys: &[&str]) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for sample in samples.iter().filter(|s| s.name == name) {
        let key: Vec<&str> = keys.iter().map(|k| sample.labels.get(*k).map_or("", String::as_str)).collect();
        *sums.entry(key.join(" ")).or_insert(0.0) += sample.value;
    }
    sums
}

/// What grew between two readings of `by`: the positive differences, zeros left out.
pub fn grown(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(key, value)| (key.clone(), value - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, grew)| *grew > 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",group="authorization.k8s.io",resource="subjectaccessreviews",verb="POST"} 40
apiserver_request_total{code="200",component="apiserver",group="",resource="secrets",verb="GET"} 7
apiserver_request_total{code="403",component="apiserver",group="",resource="secrets",verb="GET"} 2
apiserver_longrunning_requests{component="apiserver",resource="secrets",scope="resource",verb="WATCH"} 3
odd_label{text="a \"quoted\", comma"} 1.5
process_cpu_seconds_total 12.25
"#;

    #[test]
    fn samples_are_summed_over_the_labels_asked_for() {
        let samples = parse(TEXT);
        assert_eq!(samples.len(), 6);
        assert_eq!(sum(&samples, "apiserver_request_total", &[("resource", "secrets")]), 9.0);
        assert_eq!(sum(&samples, "apiserver_request_total", &[("resource", "secrets"), ("code", "403")]), 2.0);
        assert_eq!(sum(&samples, "process_cpu_seconds_total", &[]), 12.25);
        assert_eq!(samples[4].labels["text"], "a \"quoted\", comma");
        let requests = by(&samples, "apiserver_request_total", &["verb", "resource"]);
        assert_eq!(requests["POST subjectaccessreviews"], 40.0);
        assert_eq!(requests["GET secrets"], 9.0);
        let later = BTreeMap::from([("GET secrets".to_string(), 9.0), ("POST subjectaccessreviews".to_string(), 45.0)]);
        assert_eq!(grown(&requests, &later), BTreeMap::from([("POST subjectaccessreviews".to_string(), 5.0)]));
    }
}
