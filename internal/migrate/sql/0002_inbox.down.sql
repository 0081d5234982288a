DROP TABLE /*schema*/inbox_quarantine;
DROP TABLE /*schema*/inbox;
