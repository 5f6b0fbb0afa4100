"""The frontend's routes, an API each: `completions` (OpenAI's completions and chat completions),
`responses` (OpenAI's Responses), `conversations`, `messages` (Anthropic's Messages) and `tokenizer`
(vLLM's tokenizer routes). Each module's `add_routes` adds its routes to the app over the shared
`trtspec.openai.frontend.Frontend`."""
