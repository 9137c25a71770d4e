"""The engine: the maths of a transformer's forward pass (and backward), box by box, and the
handles a user holds (Model, Seq2SeqModel)."""
