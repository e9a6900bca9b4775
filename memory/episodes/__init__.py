"""Layer 4: episodes — one summary per finished session: the index, search, recall, vectors
and the evidence lines recall gives the model."""
