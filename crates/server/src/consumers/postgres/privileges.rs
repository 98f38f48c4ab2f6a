//! The privileges the outbox consumer's role needs, kept in one list: the GRANT statements
//! docs/consumers.md shows ([`grants`]) come from it, and so does the check that names what is
//! missing when PostgreSQL refuses a statement with `insufficient_privilege` (SQLSTATE 42501),
//! whose own message ("permission denied for table …") does not say which privilege.

use tokio_postgres::error::{DbError, SqlState};
use tokio_postgres::Client;

use super::TableNames;

/// The table a privilege is on.
#[derive(Clone, Copy, PartialEq)]
enum On {
    Outbox,
    Dead,
}

/// Every privilege the consumer's statements use.
const NEEDED: &[(On, &str)] = &[
    // Taking rows, the lag count, and the WHERE and RETURNING of the deletes.
    (On::Outbox, "SELECT"),
    // `SELECT … FOR UPDATE` locks the rows it takes, which PostgreSQL allows only with UPDATE.
    (On::Outbox, "UPDATE"),
    // Published rows are deleted; dead-lettered ones are moved out.
    (On::Outbox, "DELETE"),
    // The move into the dead-letter table.
    (On::Dead, "INSERT"),
];

fn table(on: On, names: &TableNames) -> &str {
    match on {
        On::Outbox => &names.table,
        On::Dead => &names.dead,
    }
}

/// The schema of a schema-qualified table, whose `USAGE` the role needs too.
fn schema(names: &TableNames) -> Option<&str> {
    names.table.split_once('.').map(|(schema, _)| schema)
}

/// The GRANT statements that give `role` what the consumer of `names` needs (docs/consumers.md
/// shows them for `herald_outbox` and role `herald`).
pub(super) fn grants(names: &TableNames, role: &str) -> String {
    let mut sql = String::new();
    if let Some(schema) = schema(names) {
        sql.push_str(&format!("GRANT USAGE ON SCHEMA {schema} TO {role};\n"));
    }
    for on in [On::Outbox, On::Dead] {
        let privileges: Vec<&str> = NEEDED
            .iter()
            .filter(|(o, _)| *o == on)
            .map(|(_, p)| *p)
            .collect();
        sql.push_str(&format!(
            "GRANT {} ON {} TO {role};\n",
            privileges.join(", "),
            table(on, names)
        ));
    }
    sql
}

/// Whether PostgreSQL refused a statement because the role lacks a privilege.
pub(super) fn is_denied(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

/// PostgreSQL's refusal `db`, followed by the privileges the connection's role lacks (asked
/// on `client`, which still works after a refused statement) and the GRANT statements that
/// give it all the consumer needs.
pub(super) async fn explain(client: &Client, names: &TableNames, db: &DbError) -> String {
    let refused = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    match missing(client, names).await {
        Ok((role, missing)) => {
            let grant = grants(names, &quote_ident(&role)).replace('\n', " ");
            match missing.is_empty() {
                false => format!(
                    "{refused}: role {role:?} lacks {}; the consumer needs: {}",
                    missing.join(", "),
                    grant.trim_end()
                ),
                // Granted meanwhile, or a privilege beyond the list (a column's, say).
                true => format!("{refused}; the consumer needs: {}", grant.trim_end()),
            }
        }
        Err(_) => format!(
            "{refused}; the consumer needs: {}",
            grants(names, "<role>").replace('\n', " ").trim_end()
        ),
    }
}

/// `name` as a quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The connection's role, and the privileges of [`NEEDED`] (and schema `USAGE`) it lacks.
async fn missing(
    client: &Client,
    names: &TableNames,
) -> Result<(String, Vec<String>), tokio_postgres::Error> {
    let role: String = client
        .query_one("SELECT current_user::text", &[])
        .await?
        .get(0);
    if let Some(schema) = schema(names) {
        // Without USAGE the table's privileges cannot even be looked up.
        let usage: bool = client
            .query_one("SELECT has_schema_privilege($1::text, 'USAGE')", &[&schema])
            .await?
            .get(0);
        if !usage {
            return Ok((role, vec![format!("USAGE on schema {schema}")]));
        }
    }
    let mut lacking = Vec::new();
    for (on, privilege) in NEEDED {
        let t = table(*on, names);
        let granted: bool = client
            .query_one(
                "SELECT has_table_privilege($1::text, $2::text)",
                &[&t, privilege],
            )
            .await?
            .get(0);
        if !granted {
            lacking.push(format!("{privilege} on {t}"));
        }
    }
    Ok((role, lacking))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_cover_every_needed_privilege() {
        let names = TableNames::new("herald_outbox").unwrap();
        assert_eq!(
            grants(&names, "herald"),
            "GRANT SELECT, UPDATE, DELETE ON herald_outbox TO herald;\n\
             GRANT INSERT ON herald_outbox_dead TO herald;\n"
        );
        let names = TableNames::new("app.outbox").unwrap();
        assert!(grants(&names, "h").starts_with("GRANT USAGE ON SCHEMA app TO h;\n"));
    }
}
