"""The vocabulary every part of lmpress speaks: the data that flows between the fronts and the
engines (`types`), the errors a user can cause and the kinds of a failed request (`errors`),
and the parts of a request that every front reads and every engine translates: guided decoding
(`guided`), tools (`tools`), images (`images`) and the chat templates a recipe can name
(`chat_templates`). Nothing here imports an engine, a front or a backend library."""
