//! The `kubectl get vmclaim` view, from the API server's Table rendering, so the columns are
//! exactly the CRD's printer columns.

use kube::Client;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    pub column_definitions: Vec<ColumnDefinition>,
    #[serde(default)]
    pub rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
pub struct ColumnDefinition {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct Row {
    pub cells: Vec<serde_json::Value>,
}

/// Fetches the claims of `namespace` as a Table and renders it like kubectl.
pub async fn claims_view(kube: &Client, namespace: &str) -> Result<String, kube::Error> {
    let request = http::Request::get(format!(
        "/apis/banlieue.io/v1alpha1/namespaces/{namespace}/virtualmachineclaims"
    ))
    .header(
        http::header::ACCEPT,
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .body(Vec::new())
    .map_err(kube::Error::HttpError)?;
    let table: Table = kube.request(request).await?;
    Ok(render(&table))
}

/// kubectl's layout: upper-case headers, columns padded to their widest cell, three spaces.
pub fn render(table: &Table) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        table
            .column_definitions
            .iter()
            .map(|c| c.name.to_uppercase())
            .collect(),
    ];
    for row in &table.rows {
        rows.push(
            row.cells
                .iter()
                .map(|cell| match cell {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                })
                .collect(),
        );
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<width$}", width = widths[i]))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_kubectl() {
        let table: Table = serde_json::from_value(serde_json::json!({
            "columnDefinitions": [{"name": "Name"}, {"name": "Pool"}, {"name": "VM"}, {"name": "Phase"}],
            "rows": [{"cells": ["sandbox-for-alice", "sandbox-pool", null, "Pending"]}]
        }))
        .unwrap();
        assert_eq!(
            render(&table),
            "NAME                POOL           VM   PHASE\nsandbox-for-alice   sandbox-pool        Pending\n"
        );
    }
}
