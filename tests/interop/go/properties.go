package main

// MQTT 5.0 publish properties: the protocol's keys <-> paho.golang's PublishProperties.

import (
	"encoding/hex"
	"fmt"

	"github.com/eclipse/paho.golang/paho"
)

// sentProperties are the properties of a publish command; never nil.
func sentProperties(in *publishProperties) (*paho.PublishProperties, error) {
	out := &paho.PublishProperties{}
	if in == nil {
		return out, nil
	}
	for _, pair := range in.UserProperties {
		if len(pair) != 2 {
			return nil, fmt.Errorf("field 'properties.user_properties' must hold [key, value] pairs, got %q", pair)
		}
		out.User = append(out.User, paho.UserProperty{Key: pair[0], Value: pair[1]})
	}
	if in.CorrelationData != nil {
		data, err := hex.DecodeString(*in.CorrelationData)
		if err != nil {
			return nil, fmt.Errorf("field 'properties.correlation_data' must be hex: %v", err)
		}
		out.CorrelationData = data
	}
	if in.ResponseTopic != nil {
		out.ResponseTopic = *in.ResponseTopic
	}
	if in.ContentType != nil {
		out.ContentType = *in.ContentType
	}
	if in.PayloadFormat != nil && *in.PayloadFormat > 1 {
		return nil, fmt.Errorf("field 'properties.payload_format' must be 0 or 1, got %d", *in.PayloadFormat)
	}
	out.PayloadFormat = in.PayloadFormat
	out.MessageExpiry = in.MessageExpiry
	out.TopicAlias = in.TopicAlias
	return out, nil
}

// receivedProperties are a received message's properties, under the protocol's keys; keys the
// message did not carry are left out. paho.golang keeps strings and binary data without a
// "present" mark, so an empty content type, response topic or correlation data reads as absent.
func receivedProperties(in *paho.PublishProperties) map[string]any {
	out := map[string]any{}
	if in == nil {
		return out
	}
	if len(in.User) > 0 {
		pairs := make([][2]string, len(in.User))
		for i, p := range in.User {
			pairs[i] = [2]string{p.Key, p.Value}
		}
		out["user_properties"] = pairs
	}
	if in.ResponseTopic != "" {
		out["response_topic"] = in.ResponseTopic
	}
	if len(in.CorrelationData) > 0 {
		out["correlation_data"] = hex.EncodeToString(in.CorrelationData)
	}
	if in.ContentType != "" {
		out["content_type"] = in.ContentType
	}
	if in.PayloadFormat != nil {
		out["payload_format"] = *in.PayloadFormat
	}
	if in.MessageExpiry != nil {
		out["message_expiry"] = *in.MessageExpiry
	}
	if in.TopicAlias != nil {
		out["topic_alias"] = *in.TopicAlias
	}
	// paho.golang decodes one Subscription Identifier per PUBLISH (the last when the server
	// sends several, for overlapping subscriptions): a list of that one.
	if in.SubscriptionIdentifier != nil {
		out["subscription_ids"] = []int{*in.SubscriptionIdentifier}
	}
	return out
}
