from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenizeRequest(_message.Message):
    __slots__ = ("input", "model_name", "add_special_tokens")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input: str
    model_name: str
    add_special_tokens: bool
    def __init__(self, input: _Optional[str] = ..., model_name: _Optional[str] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("input_ids", "success", "error_message", "offset_pairs")
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_PAIRS_FIELD_NUMBER: _ClassVar[int]
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    success: bool
    error_message: str
    offset_pairs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, input_ids: _Optional[_Iterable[int]] = ..., success: _Optional[bool] = ..., error_message: _Optional[str] = ..., offset_pairs: _Optional[_Iterable[int]] = ...) -> None: ...

class ConversationTurn(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class ChatTemplateRequest(_message.Message):
    __slots__ = ("conversation_turns", "tools", "documents", "chat_template", "return_assistant_tokens_mask", "continue_final_message", "add_generation_prompt", "chat_template_kwargs", "model_name")
    class ChatTemplateKwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    CONVERSATION_TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    RETURN_ASSISTANT_TOKENS_MASK_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    conversation_turns: _containers.RepeatedCompositeFieldContainer[ConversationTurn]
    tools: _containers.RepeatedCompositeFieldContainer[ToolDescription]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    chat_template: str
    return_assistant_tokens_mask: bool
    continue_final_message: bool
    add_generation_prompt: bool
    chat_template_kwargs: _containers.MessageMap[str, Value]
    model_name: str
    def __init__(self, conversation_turns: _Optional[_Iterable[_Union[ConversationTurn, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[ToolDescription, _Mapping]]] = ..., documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., chat_template: _Optional[str] = ..., return_assistant_tokens_mask: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ..., add_generation_prompt: _Optional[bool] = ..., chat_template_kwargs: _Optional[_Mapping[str, Value]] = ..., model_name: _Optional[str] = ...) -> None: ...

class ImageUrl(_message.Message):
    __slots__ = ("url",)
    URL_FIELD_NUMBER: _ClassVar[int]
    url: str
    def __init__(self, url: _Optional[str] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("type", "text", "image_url")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    type: str
    text: str
    image_url: ImageUrl
    def __init__(self, type: _Optional[str] = ..., text: _Optional[str] = ..., image_url: _Optional[_Union[ImageUrl, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "content_parts", "tool_calls_json")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_PARTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    content_parts: _containers.RepeatedCompositeFieldContainer[ContentPart]
    tool_calls_json: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., content_parts: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., tool_calls_json: _Optional[str] = ...) -> None: ...

class ToolDescription(_message.Message):
    __slots__ = ("tool",)
    class ToolEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    TOOL_FIELD_NUMBER: _ClassVar[int]
    tool: _containers.MessageMap[str, Value]
    def __init__(self, tool: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("document",)
    class DocumentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    document: _containers.MessageMap[str, Value]
    def __init__(self, document: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("string_value", "number_value", "bool_value", "list_value", "struct_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    NUMBER_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRUCT_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    number_value: float
    bool_value: bool
    list_value: ListValue
    struct_value: StructValue
    def __init__(self, string_value: _Optional[str] = ..., number_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., list_value: _Optional[_Union[ListValue, _Mapping]] = ..., struct_value: _Optional[_Union[StructValue, _Mapping]] = ...) -> None: ...

class ListValue(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class StructValue(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class ChatTemplateResponse(_message.Message):
    __slots__ = ("rendered_prompt", "success", "error_message")
    RENDERED_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    rendered_prompt: str
    success: bool
    error_message: str
    def __init__(self, rendered_prompt: _Optional[str] = ..., success: _Optional[bool] = ..., error_message: _Optional[str] = ...) -> None: ...

class InitializeTokenizerRequest(_message.Message):
    __slots__ = ("model_name", "enable_thinking", "add_generation_prompt")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ENABLE_THINKING_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    enable_thinking: bool
    add_generation_prompt: bool
    def __init__(self, model_name: _Optional[str] = ..., enable_thinking: _Optional[bool] = ..., add_generation_prompt: _Optional[bool] = ...) -> None: ...

class InitializeTokenizerResponse(_message.Message):
    __slots__ = ("success", "error_message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    error_message: str
    def __init__(self, success: _Optional[bool] = ..., error_message: _Optional[str] = ...) -> None: ...

class PlaceholderRange(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class PlaceholderRangeList(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[PlaceholderRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[PlaceholderRange, _Mapping]]] = ...) -> None: ...

class MultiModalFeatures(_message.Message):
    __slots__ = ("mm_hashes", "mm_placeholders")
    class MmHashesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StringList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StringList, _Mapping]] = ...) -> None: ...
    class MmPlaceholdersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PlaceholderRangeList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PlaceholderRangeList, _Mapping]] = ...) -> None: ...
    MM_HASHES_FIELD_NUMBER: _ClassVar[int]
    MM_PLACEHOLDERS_FIELD_NUMBER: _ClassVar[int]
    mm_hashes: _containers.MessageMap[str, StringList]
    mm_placeholders: _containers.MessageMap[str, PlaceholderRangeList]
    def __init__(self, mm_hashes: _Optional[_Mapping[str, StringList]] = ..., mm_placeholders: _Optional[_Mapping[str, PlaceholderRangeList]] = ...) -> None: ...

class RenderChatCompletionRequest(_message.Message):
    __slots__ = ("model_name", "messages", "tools_json", "chat_template", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools_json: str
    chat_template: str
    add_generation_prompt: bool
    continue_final_message: bool
    chat_template_kwargs: str
    def __init__(self, model_name: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools_json: _Optional[str] = ..., chat_template: _Optional[str] = ..., add_generation_prompt: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ..., chat_template_kwargs: _Optional[str] = ...) -> None: ...

class RenderChatCompletionResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "features", "success", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    features: MultiModalFeatures
    success: bool
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., features: _Optional[_Union[MultiModalFeatures, _Mapping]] = ..., success: _Optional[bool] = ..., error_message: _Optional[str] = ...) -> None: ...

class RenderCompletionRequest(_message.Message):
    __slots__ = ("model_name", "prompt")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    prompt: str
    def __init__(self, model_name: _Optional[str] = ..., prompt: _Optional[str] = ...) -> None: ...

class RenderCompletionResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "success", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    success: bool
    error_message: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., success: _Optional[bool] = ..., error_message: _Optional[str] = ...) -> None: ...
