"""Federation: this region's links to the other regions (`links`), where
they are kept (`peers`), and the copy of the authoritative region's ACL
policies and global tokens (`replication`). docs/architecture.md
"Federation" has the whole picture."""
