"""What a user or an admin does to memory as a whole: forget, erase, withdraw, the audit
trail, export/import, copy to PostgreSQL, counts for operators."""
