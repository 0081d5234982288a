package llmq

// Version is this build's release of llmq, following semantic versioning.
// Until 1.0.0 a minor release may change the public API or the schema;
// CHANGELOG.md says what changed and what a host must do. Migrations are
// always applied in order by Migrate, whatever versions lie between.
const Version = "0.1.0-dev"
